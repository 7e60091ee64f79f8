package ib

import (
	"fmt"
	"strings"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// hcaFilter is a parsed NCCL_IB_HCA, read as NCCL reads it (ncclenv.List):
// "mlx5_0:1,mlx5_1" selects by name prefix and optional port; a leading '^'
// excludes instead; '=' after it (or at the start) makes names exact. Rail
// and plane fields (NCCL 2.30) are parsed; a port that is not a number is
// read as 0, which matches no port, with a WARN. An empty port ("mlx5_0:") is
// any port, as NCCL 2.30 reads it, with a WARN (see emptyPortWarnings).
type hcaFilter struct {
	list ncclenv.List
}

// readHCAFilter reads NCCL_IB_HCA, WARNing what NCCL would read differently
// from what was probably meant. spec is the value, "" when unset.
func readHCAFilter(log nccl.Logger) (f hcaFilter, spec string) {
	l, set := envHCA.Get(log)
	if set {
		spec, _ = ncclenv.Value(envHCA.Name())
		for _, w := range emptyPortWarnings(spec) {
			log.Warnf("NET/GoIB : %s=%s: %s", envHCA.Name(), spec, w)
		}
	}
	return hcaFilter{list: l}, spec
}

// emptyPortWarnings flags entries written "<hca>:" with nothing after the
// colon. NCCL 2.30 reads the empty port as any port, and so does ncclenv;
// NCCL before 2.30 read it with atoi as port 0, which matches no port, so the
// same setting selected nothing of that HCA there. Saying how to write either
// meaning keeps a job portable across NCCL versions. "<hca>::<rail>" is the
// 2.30 way to give a rail for any port and is left alone.
func emptyPortWarnings(spec string) []string {
	var out []string
	for _, item := range strings.Split(strings.TrimLeft(spec, "^="), ",") {
		name, rest, ok := strings.Cut(item, ":")
		if ok && rest == "" && name != "" {
			out = append(out, fmt.Sprintf("entry %q has an empty port: read as any port of %s, as NCCL 2.30 does "+
				"(older NCCL reads it as port 0 and uses no port of %s); write %q for every port or \"%s:<port>\" for one",
				item, name, name, name, name))
		}
	}
	return out
}

// match reports whether port of device dev is selected (port < 0: any).
func (f hcaFilter) match(dev string, port int) bool {
	if port < 0 {
		port = -1
	}
	return f.list.Match(dev, port)
}

// hcaSeen is what discovery found besides the ports it kept, for the
// NCCL_IB_HCA warnings: every device with its port count, and the ACTIVE IB
// or RoCE ports the filter left out.
type hcaSeen struct {
	ports    []hcaPorts
	excluded []string // "<hca>:<port>"
}

type hcaPorts struct {
	name  string
	count int
}

// filterWarnings says where NCCL_IB_HCA (spec, set) selects something other
// than what it probably meant: an entry naming a port its HCA does not have
// (mlx5_0:3 on a one-port card: NCCL silently uses no port of it), and a
// filter that leaves out every usable port, after which the job silently runs
// on the socket fallback (TCP) at a fraction of the fabric's bandwidth, with
// only INFO lines saying so (NCCL's IB transport is as quiet: "NET/IB : No
// device found."). kept is how many ports the filter let through.
func (s hcaSeen) filterWarnings(f hcaFilter, spec string, kept int) []string {
	var out []string
	if !f.list.Exclude {
		for _, e := range f.list.Entries {
			if e.Port <= 0 {
				continue
			}
			var named []string
			found := false
			for _, p := range s.ports {
				if !(p.name == e.Name || !f.list.Exact && strings.HasPrefix(p.name, e.Name)) {
					continue
				}
				named = append(named, fmt.Sprintf("%s (ports 1-%d)", p.name, p.count))
				found = found || e.Port <= p.count
			}
			if len(named) > 0 && !found {
				out = append(out, fmt.Sprintf("%s=%s: entry %s:%d names a port that %s does not have, so it selects nothing; "+
					"give a port the HCA has, or the name alone for every port", envHCA.Name(), spec, e.Name, e.Port, strings.Join(named, ", ")))
			}
		}
	}
	if kept == 0 && len(s.excluded) > 0 {
		var all []string
		for _, p := range s.ports {
			all = append(all, p.name)
		}
		out = append(out, fmt.Sprintf("%s=%s selects none of this host's ACTIVE RDMA ports (%s; HCAs: %s), so the ib transport has no device "+
			"and the job falls back to the socket transport (TCP) unless NCCL_GO_TRANSPORT=ib; fix %s (names are prefixes, \"=\" makes them exact, "+
			"\"^\" excludes; `ncclnet-go devices` shows what it selects) or unset it",
			envHCA.Name(), spec, strings.Join(s.excluded, ", "), strings.Join(all, ", "), envHCA.Name()))
	}
	return out
}
