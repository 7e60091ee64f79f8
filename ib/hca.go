package ib

import (
	"fmt"
	"strconv"
	"strings"
)

// hcaFilter is a parsed NCCL_IB_HCA: "mlx5_0:1,mlx5_1" selects by name prefix
// and optional port; a leading '^' excludes instead; '=' after it (or at the
// start) makes names exact. Rail and plane fields (":<rail>:<plane>", NCCL
// 2.30) are accepted and ignored.
type hcaFilter struct {
	exclude bool
	exact   bool
	specs   []hcaSpec
}

type hcaSpec struct {
	name string
	port int // -1: any port
}

const maxHCAs = 32

func parseHCAFilter(s string) (hcaFilter, error) {
	var f hcaFilter
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "^") {
		f.exclude = true
		s = s[1:]
	}
	if strings.HasPrefix(s, "=") {
		f.exact = true
		s = s[1:]
	}
	if s == "" {
		return f, nil
	}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		parts := strings.Split(item, ":")
		spec := hcaSpec{name: parts[0], port: -1}
		if len(parts) > 1 && parts[1] != "" {
			p, err := strconv.Atoi(parts[1])
			if err != nil || p < 1 {
				return hcaFilter{}, fmt.Errorf("bad port %q in %q", parts[1], item)
			}
			spec.port = p
		}
		if len(f.specs) == maxHCAs {
			return hcaFilter{}, fmt.Errorf("more than %d entries", maxHCAs)
		}
		f.specs = append(f.specs, spec)
	}
	return f, nil
}

// match reports whether port of device dev is selected (port < 0: any).
func (f hcaFilter) match(dev string, port int) bool {
	if len(f.specs) == 0 {
		return true
	}
	hit := false
	for _, s := range f.specs {
		nameOK := dev == s.name || !f.exact && strings.HasPrefix(dev, s.name)
		if nameOK && (s.port < 0 || port < 0 || s.port == port) {
			hit = true
			break
		}
	}
	return hit != f.exclude
}
