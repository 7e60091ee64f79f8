// Command libnccl-net-go is the default plugin library: built with
// -buildmode=c-shared into libnccl-net-go.so, it offers NCCL the ib transport
// when an RDMA port is usable and the socket transport otherwise
// (NCCL_GO_TRANSPORT forces one).
package main

import (
	"github.com/libnccl-net-go/libnccl-net-go/ib"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
	_ "github.com/libnccl-net-go/libnccl-net-go/plugin"
	"github.com/libnccl-net-go/libnccl-net-go/socket"
)

func init() {
	nccl.Register("ib", 10, ib.New)
	nccl.Register("socket", 100, socket.New)
}

func main() {}
