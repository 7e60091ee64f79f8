// Package forkguard owns one promise: a process forked from the host process
// does not keep the sockets a transport tracks with it open. This
// repository's transports (socket, ib) and the metrics endpoint track all of
// theirs; a vendor's transport tracks its own the same way.
//
// Frameworks fork after NCCL is up: PyTorch's DataLoader workers with the
// default "fork" start method, forked checkpoint writers, os.fork in user
// code. A child inherits every descriptor, and a TCP socket lives until its
// last descriptor is closed. So when a rank that has children is killed, or
// aborts and closes its comms, its kernel sends no FIN: the children still
// hold the connections, the kernel keeps acknowledging the peer's data and
// keepalive probes, and the peer waits for a rank that is gone, until the
// children exit (a DataLoader worker notices its parent's death within about
// 5 s; a forked writer may live for minutes). The same inherited listening
// socket keeps the rank's port bound and accepts connections nobody serves.
//
// The Go runtime does not run in a forked child, so the closing is done by a
// C handler registered with pthread_atfork: in the child, right after fork,
// it closes every socket tracked here, which only drops the child's
// reference; the parent's sockets are untouched. A descriptor is tracked
// with the socket's inode and closed in the child only when the descriptor
// still names that socket, so a number the parent closed and reused for a
// file of its own between Track and fork is never touched. exec needs none
// of this where sockets are opened close-on-exec, as Go's net package and
// this repository's SOCK_CLOEXEC sockets are.
//
// Cost: nothing on the data path (tracking happens at set-up and close, one
// fstat each); in the child, one fstat and one close per tracked socket. On
// the 2-core CI VM a fork of a test process took 3.5-3.8 ms, and 6.7-7.2 ms
// with 1,000 tracked sockets: about 3.3 us per socket
// (go test -run XXX -bench Fork -benchtime 300x ./forkguard).
package forkguard
