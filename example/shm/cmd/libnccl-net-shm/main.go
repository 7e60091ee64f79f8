// Command libnccl-net-shm is the shm example's plugin library: built with
//
//	scripts/build-plugin.sh --name Shm --out build/libnccl-net-shm.so ./example/shm/cmd/libnccl-net-shm
//
// it is what NCCL loads with NCCL_NET_PLUGIN=shm (NCCL_NET=Shm selects it by
// name). The glue (package plugin) supplies the C tables, logging, metrics and
// the per-version adaptation; this file only says which transport to offer.
package main

import (
	"github.com/libnccl-net-go/libnccl-net-go/example/shm"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
	_ "github.com/libnccl-net-go/libnccl-net-go/plugin"
)

func init() {
	nccl.Register("shm", 10, shm.New)
}

func main() {}
