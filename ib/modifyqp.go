package ib

import (
	"errors"
	"fmt"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// mqpRetry is NCCL's policy for a QP state transition that fails
// (NCCL_IB_MQP_RETRY_*). On RoCE the kernel resolves the peer GID's
// link-layer address while moving a QP to RTR, and fails the call with
// ETIMEDOUT when the neighbour has not answered ARP in time: at job start,
// with thousands of connections made at once, that is a passing condition,
// not a broken path. NCCL retries it with a linearly growing sleep (100 ms,
// 200 ms, ... 34 times: about a minute in all); failing at once turned it
// into a failed job.
type mqpRetry struct {
	all   bool          // NCCL_IB_MQP_RETRY_ALL: any error, not only ETIMEDOUT
	count int           // NCCL_IB_MQP_RETRY_CNT
	sleep time.Duration // NCCL_IB_MQP_RETRY_SLEEP_MSEC
}

func (r mqpRetry) retryable(err error) bool {
	return r.all || errors.Is(err, verbs.ETIMEDOUT)
}

// setupBound is what ends a connection's set-up early: its deadline
// (NCCL_GO_TIMEOUT from the start of the handshake) and, for an accept, its
// listen's Close. Finalize ends every set-up.
type setupBound struct {
	by    time.Time
	abort <-chan struct{} // nil: only Finalize
}

// modifyQP runs one QP state transition under the retry policy. It runs on a
// connection's set-up goroutine, never on NCCL's thread, so it may sleep;
// the sleep ends early at Finalize or when the listen is closed (Close waits
// for its handshakes), and no retry starts whose sleep would end past the
// set-up deadline, so the handshake stays bounded. The QP keeps its state
// when a transition fails, which is what makes trying it again valid.
func (c *commCore) modifyQP(what string, transition func() error) error {
	r := c.cfg.mqpRetry
	start := time.Now()
	for retry := 1; ; retry++ {
		err := transition()
		if err == nil {
			if retry > 1 {
				c.log.Infof(nccl.SubsysNet, "NET/GoIB : %s succeeded at retry %d/%d, %v after it first failed", what, retry-1, r.count, time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if !r.retryable(err) {
			return err
		}
		if retry > r.count {
			return fmt.Errorf("%w (retried %d times over %v: NCCL_IB_MQP_RETRY_CNT=%d, NCCL_IB_MQP_RETRY_SLEEP_MSEC=%d)",
				err, r.count, time.Since(start).Round(time.Millisecond), r.count, r.sleep.Milliseconds())
		}
		sleep := r.sleep * time.Duration(retry)
		if time.Now().Add(sleep).After(c.setup.by) {
			return fmt.Errorf("%w (retried %d times over %v; retry %d would end past the connection set-up bound, %s: %v)",
				err, retry-1, time.Since(start).Round(time.Millisecond), retry, timeout.Peer.Name(), c.cfg.setupLimit)
		}
		c.log.Infof(nccl.SubsysNet, "NET/GoIB : %s failed: %v; retrying %d/%d after %v (NCCL_IB_MQP_RETRY_CNT, NCCL_IB_MQP_RETRY_SLEEP_MSEC)",
			what, err, retry, r.count, sleep)
		if !c.t.pause(sleep, c.setup.abort) {
			why := "the listen was closed"
			if c.t.life.ctx.Err() != nil {
				why = "the transport was finalized"
			}
			return fmt.Errorf("%w (retry %d/%d interrupted: %s)", err, retry, r.count, why)
		}
	}
}
