package ib

import (
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// hcaFilter is a parsed NCCL_IB_HCA, read as NCCL reads it (ncclenv.List):
// "mlx5_0:1,mlx5_1" selects by name prefix and optional port; a leading '^'
// excludes instead; '=' after it (or at the start) makes names exact. Rail
// and plane fields (NCCL 2.30) are parsed; a port that is not a number is
// read as 0, which matches no port, with a WARN.
type hcaFilter struct {
	list ncclenv.List
}

// readHCAFilter reads NCCL_IB_HCA, WARNing what NCCL would read differently
// from what was probably meant. spec is the value, "" when unset.
func readHCAFilter(log nccl.Logger) (f hcaFilter, spec string) {
	l, set := envHCA.Get(log)
	if set {
		spec, _ = ncclenv.Value(envHCA.Name())
	}
	return hcaFilter{list: l}, spec
}

// match reports whether port of device dev is selected (port < 0: any).
func (f hcaFilter) match(dev string, port int) bool {
	if port < 0 {
		port = -1
	}
	return f.list.Match(dev, port)
}
