// Package socket is the TCP transport: the fallback every host has, and the
// one NCCL_GO_TRANSPORT=socket forces. It owns device discovery by NCCL's own
// interface rules (NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY, the default ib /
// non-docker / docker / lo / virbr order), the connection handshake (magic,
// protocol version, per-listen secret), and the data path.
//
// Each connection is one control stream plus NCCL_SOCKET_NTHREADS ×
// NCCL_NSOCKS_PERTHREAD data streams. Small messages travel inline after their
// 16-byte header on the control stream, written and read directly on NCCL's
// thread with non-blocking syscalls (no goroutine hand-off on the latency
// path). Larger messages are striped across the data streams, each driven by
// its own goroutine fed through a lock-free single-producer ring. See
// docs/socket.md for the wire format, the settings and measured numbers.
//
// The package exports New for the plugin's main (which registers it as
// "socket"); it does not register itself.
package socket
