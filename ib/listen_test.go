package ib

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// brokenListener fails every Accept the way the kernel does when the process
// is out of file descriptors.
type brokenListener struct{}

func (brokenListener) Accept() (net.Conn, error) {
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
}
func (brokenListener) Close() error   { return nil }
func (brokenListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// An accept that fails for a reason other than Close must fail the listen
// (as NCCL's socketTryAccept does), not leave Accept returning "not yet"
// forever with nothing logged.
func TestAcceptErrorFailsTheListen(t *testing.T) {
	log := &captureLog{}
	tr := &Transport{log: log}
	tr.life.init()
	l := &listener{t: tr, ln: brokenListener{}, done: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	l.acceptLoop() // returns once Accept fails

	rc, err := l.Accept()
	assert.Nil(t, rc)
	require.Error(t, err, "a listen whose socket can no longer accept must fail Accept")
	var ne *nccl.Error
	if assert.True(t, errors.As(err, &ne)) {
		assert.Equal(t, nccl.SystemError, ne.Code)
	}
	assert.True(t, log.has("EMFILE") || log.has("too many open files"), "the WARN names the error: %v", log.lines)
	assert.NoError(t, l.Close())
}
