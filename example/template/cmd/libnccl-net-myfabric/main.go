// Command libnccl-net-myfabric builds the template transport into a plugin:
//
//	scripts/build-plugin.sh --name MyFabric --out build/libnccl-net-myfabric.so ./example/template/cmd/libnccl-net-myfabric
package main

import (
	"github.com/libnccl-net-go/libnccl-net-go/example/template/myfabric"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
	_ "github.com/libnccl-net-go/libnccl-net-go/plugin" // the C glue: tables, logging, metrics
)

func init() {
	nccl.Register("myfabric", 10, myfabric.New)
}

func main() {}
