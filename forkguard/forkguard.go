package forkguard

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// Track marks fd, a socket the caller just opened, to be closed in forked
// children. Call it before the descriptor can be handed to a peer's traffic;
// a descriptor that is not a socket is ignored. The error (the atfork handler
// could not be registered, or fstat failed) leaves the descriptor as it would
// be without this package; callers log it, they do not fail on it.
func Track(fd int) error { return track(fd) }

// Untrack forgets fd. Call it before closing the descriptor.
func Untrack(fd int) { untrack(fd) }

// Close untracks and closes fd.
func Close(fd int) error {
	untrack(fd)
	return unix.Close(fd)
}

// TrackConn tracks the socket under a net.Conn or net.Listener. Those are
// closed by their own Close, which cannot untrack first; the inode check in
// the child makes that safe.
func TrackConn(c syscall.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var terr error
	if err := raw.Control(func(fd uintptr) { terr = track(int(fd)) }); err != nil {
		return err
	}
	return terr
}

// Listener tracks ln's socket and every connection it accepts.
func Listener(ln net.Listener) net.Listener {
	if sc, ok := ln.(syscall.Conn); ok {
		_ = TrackConn(sc)
	}
	return listener{ln}
}

type listener struct{ net.Listener }

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		if sc, ok := c.(syscall.Conn); ok {
			_ = TrackConn(sc)
		}
	}
	return c, err
}
