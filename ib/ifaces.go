package ib

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/internal/testhook"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// hostInterfaces is where findOOBInterface lists interfaces; tests replace it.
var hostInterfaces = testhook.New[ncclsock.Source](ncclsock.Host{})

// findOOBInterface chooses the one interface the TCP handshake listens on,
// with NCCL's rules (internal/ncclsock, as the socket transport):
// NCCL_SOCKET_IFNAME if set, else ib*, the NCCL_COMM_ID subnet, anything but
// docker*/lo*/virbr*, docker*, lo*, virbr*; NCCL_SOCKET_FAMILY restricts the
// family. An IPv6 link-local address is used as NCCL uses it (its handle
// carries the scope id); our handle carries no zone, so the connector dials it
// through its own handshake interface (dialAddr), as the socket transport
// does.
func findOOBInterface(log nccl.Logger) (string, netip.Addr, error) {
	ifs, err := hostInterfaces.Get().Interfaces()
	if err != nil {
		return "", netip.Addr{}, err
	}
	found, how := ncclsock.Find(ifs, ncclsock.Options{Max: 1, Log: log, Prefix: logPrefix})
	if len(found) == 0 {
		if v, ok := ncclenv.Lookup(ncclsock.IfName.Name()); ok && len(strings.TrimSpace(v)) > 1 {
			return "", netip.Addr{}, fmt.Errorf("no up interface with a usable address matches %s", how)
		}
		return "", netip.Addr{}, fmt.Errorf("no up interface with an IP address; set NCCL_SOCKET_IFNAME")
	}
	return found[0].Name, found[0].Addr, nil
}
