package socket

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The receiving end of a connection acknowledges small messages every second
// one by default (setAckMode), not each: an ACK sent from inside the read that
// finds a message is on NCCL's round trip. NCCL_GO_SOCKET_QUICKACK=1 gives
// back the kernel's rule, one ACK per message, which is also what this test
// sees when clearing TCP_QUICKACK does nothing.
func TestReceiverDelaysAcks(t *testing.T) {
	const msgs = 400
	for _, tc := range []struct {
		name     string
		env      map[string]string
		leave    bool    // the kernel leaves delayed-ACK mode after the warm-up
		min, max float64 // pure ACKs the receiver sent, per message
	}{
		{"default", map[string]string{}, false, 0, 0.75},
		// As after its delayed-ACK timer fired: the receiver must enter the
		// mode again by itself (ackEvery), or it acknowledges every message
		// from then on.
		{"kernel left the mode", map[string]string{}, true, 0, 0.75},
		{"NCCL_GO_SOCKET_QUICKACK=1", map[string]string{envQuickAck: "1"}, false, 0.9, 1.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withEnv(t, tc.env)
			tr := initLoopback(t, &captureLog{})
			s, r := pair(t, tr)
			defer s.Close()
			defer r.Close()
			if r.ackEvery != 0 {
				// A stall of 40 ms or more (the race detector, a loaded
				// machine) lets the delayed-ACK timer fire and the kernel
				// leave the mode; re-entering it often keeps such a stall
				// from deciding the count.
				r.ackEvery = 16
			}
			for range 20 {
				exchange(t, s, r, 8)
			}
			if tc.leave {
				require.NoError(t, unix.SetsockoptInt(r.ctrl, unix.IPPROTO_TCP, unix.TCP_QUICKACK, 1))
			}
			before, err := unix.GetsockoptTCPInfo(r.ctrl, unix.IPPROTO_TCP, unix.TCP_INFO)
			require.NoError(t, err)
			for range msgs {
				exchange(t, s, r, 8)
			}
			after, err := unix.GetsockoptTCPInfo(r.ctrl, unix.IPPROTO_TCP, unix.TCP_INFO)
			require.NoError(t, err)
			require.Equal(t, before.Data_segs_out, after.Data_segs_out, "the receiving end sent data on the control stream")
			perMsg := float64(after.Segs_out-before.Segs_out) / msgs
			t.Logf("%d one-at-a-time 8 B messages: the receiver sent %d ACKs (%.2f per message)", msgs, after.Segs_out-before.Segs_out, perMsg)
			require.GreaterOrEqual(t, perMsg, tc.min)
			require.LessOrEqual(t, perMsg, tc.max)
		})
	}
}

// A control stream that carries large messages goes back to the kernel's ACK
// rule (its ACK when a read empties the socket frees the sender's bounded
// send queue sooner), and back to delayed ACKs once its messages are small
// again. getsockopt(TCP_QUICKACK) is 0 in the kernel's delayed-ACK mode.
func TestBulkStreamGetsTheKernelsAckRule(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "0"}) // every byte on the control stream
	tr := initLoopback(t, &captureLog{})
	s, r := pair(t, tr)
	defer s.Close()
	defer r.Close()
	quick := func() int {
		v, err := unix.GetsockoptInt(r.ctrl, unix.IPPROTO_TCP, unix.TCP_QUICKACK)
		require.NoError(t, err)
		return v
	}
	require.Equal(t, 0, quick(), "delayed ACKs from the start")
	for range 3 * ackReassert {
		exchange(t, s, r, 8)
	}
	require.Equal(t, 0, quick(), "small messages keep delayed ACKs")
	// Each of these is at least one read of the control stream that brings
	// data (its header), so a decision falls within them.
	for range 3 * ackReassert {
		exchange(t, s, r, 2*ackSmallMax)
	}
	require.Equal(t, 1, quick(), "after large messages the kernel's rule")
	require.False(t, r.ackDelayed)
	for range 3 * ackReassert {
		exchange(t, s, r, ackSmallMax)
	}
	require.Equal(t, 0, quick(), "messages of ackSmallMax are small")
}

// A failed switch stops the attempts and says once which mode the stream is
// left in: the INFO docs/troubleshooting.md explains.
func TestAckModeFailureSaysWhichModeStays(t *testing.T) {
	for _, tc := range []struct {
		delayed bool
		stays   string
	}{
		{true, "stays with the kernel's ACK rule"},
		{false, "stays with delayed ACKs"},
	} {
		log := &captureLog{}
		tr := initLoopback(t, log)
		s, r := pair(t, tr)
		r.ackDelayed = !tc.delayed // so that the call has something to switch
		// setsockopt on a pipe fails (ENOTSOCK) as it would on a socket the
		// kernel refuses the option for.
		var p [2]int
		require.NoError(t, unix.Pipe(p[:]))
		ctrl := r.ctrl
		r.ctrl = p[0]
		r.setAckMode(tc.delayed)
		r.ctrl = ctrl
		unix.Close(p[0])
		unix.Close(p[1])
		require.Zero(t, r.ackEvery, "the attempts stop")
		require.Contains(t, log.String(), "INFO NET/GoSocket : receive connection from")
		require.Contains(t, log.String(), tc.stays+": setting TCP_QUICKACK failed")
		exchange(t, s, r, 8) // and data still moves
		s.Close()
		r.Close()
	}
}
