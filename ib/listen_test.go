package ib

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
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
	l := newListener(tr, nil, brokenListener{})
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

// NCCL closes a listen right after its Accept returned the comm. That Close
// must not touch the handshake connection the comm now owns for dead-peer
// detection: closing it would make both comms fail as "peer gone" as soon as
// a request waits a second. Accept is polled without pause so that it runs
// as soon as the handshake publishes its comm, which is where the listener
// used to still hold the connection.
func TestListenCloseAfterAcceptKeepsTheCommsConnection(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	for round := 0; round < 500; round++ {
		l, h := listenOn(t, b, 0)
		// Polled without within's pause, which would let the handshake
		// finish long before Accept runs: the race would not show.
		var sc nccl.SendComm
		var rc nccl.RecvComm
		var err error
		deadline := time.Now().Add(10 * time.Second)
		for sc == nil {
			sc, err = a.t.Connect(0, h, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef})
			require.NoError(t, err)
			require.False(t, time.Now().After(deadline), "connect: not within 10s")
		}
		for rc == nil {
			rc, err = l.Accept()
			require.NoError(t, err)
			require.False(t, time.Now().After(deadline), "accept: not within 10s")
		}
		require.NoError(t, l.Close())

		r := rc.(*recvComm)
		var rerr error
		if err := r.watch.raw.Read(func(fd uintptr) bool {
			_, rerr = unix.Read(int(fd), make([]byte, 1))
			return true
		}); err != nil {
			rerr = err
		}
		closed := !errors.Is(rerr, unix.EAGAIN)
		require.NoError(t, sc.Close())
		require.NoError(t, rc.Close())
		require.False(t, closed, "round %d: the receive comm's handshake connection was closed by the listen's Close (%v)", round, rerr)
	}
}
