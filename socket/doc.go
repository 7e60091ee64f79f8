// Package socket is the TCP transport: the fallback every host has, and the
// one NCCL_GO_TRANSPORT=socket forces. It owns device discovery by NCCL's own
// interface rules (NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY, the default ib /
// non-docker / docker / lo / virbr order), connection set-up (handle, hello,
// per-listen secret), peer liveness, and the data path.
//
// Each connection is one control stream, one liveness stream and
// NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD data streams, all raw
// non-blocking descriptors this package owns (none goes through net.Conn or
// Go's netpoller). NCCL's thread does the work: connect and accept are state
// machines its repeated calls advance; small messages travel inline after
// their 16-byte header on the control stream, large ones are striped over the
// data streams, and both are moved inside Isend/Irecv/Test with non-blocking
// syscalls. Optional helper goroutines (NCCL_GO_SOCKET_HELPERS) move the
// striped chunks under a per-stream try-lock; NCCL's thread takes over a
// helper's stream only when it stalls (NCCL_GO_SOCKET_SHARE_AFTER). A peer is dead only when its host
// stops answering on the liveness stream for NCCL_GO_TIMEOUT (live.go); slow
// or stopped peers are alive. See docs/socket.md for the wire format, the
// settings and measured numbers.
//
// The package exports New for the plugin's main (which registers it as
// "socket"); it does not register itself.
package socket
