package socket

import (
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// The summary each end logs at close says which path the messages took:
// what an operator reads to tell a latency-bound job (inline) from a striped
// one, and whether helpers or NCCL's thread moved the chunks.
func TestCloseLogsWhereMessagesWent(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "2", envHelpers: "2"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	sc, rc := connectAccept(t, tr, l, h)
	l.Close()
	s, r := sc.(*sendComm), rc.(*recvComm)

	// 8 B (inline by size), 64 KiB alone in flight (inline by the idle
	// rule), then two 512 KiB messages in flight together (striped: above
	// the idle limit, one 256 KiB chunk per stream each).
	sizes := []int{8, 64 << 10, 512 << 10, 512 << 10}
	src, dst, rqs := postRecvs(t, r, sizes, 1, 7)
	var sqs []nccl.Request
	drive := func(from, to int) {
		deadline := time.Now().Add(10 * time.Second)
		sdone, rdone := make([]bool, len(sizes)), make([]bool, len(sizes))
		for {
			all := true
			for i := from; i < to; i++ {
				if !sdone[i] {
					sdone[i], _, err = s.Test(sqs[i])
					require.NoError(t, err)
				}
				if !rdone[i] {
					rdone[i], err = r.Test(rqs[i], []int{0})
					require.NoError(t, err)
				}
				all = all && sdone[i] && rdone[i]
			}
			if all {
				return
			}
			require.True(t, time.Now().Before(deadline), "messages %d..%d never completed", from, to-1)
			runtime.Gosched()
		}
	}
	off := 0
	for i, n := range sizes {
		q, err := s.Isend(bufPtr(src[off:]), n, 1, 0)
		require.NoError(t, err)
		require.NotEqual(t, nccl.NoRequest, q)
		sqs = append(sqs, q)
		off += n
		if i < 2 {
			drive(i, i+1) // alone in flight
		}
	}
	drive(2, 4)
	require.Equal(t, src, dst)
	require.NoError(t, s.Close())
	require.NoError(t, r.Close())

	out := log.String()
	want := strconv.Itoa(len(sizes)) + " messages, " + strconv.Itoa(len(src)) + " bytes; "
	sendRe := regexp.MustCompile(`send connection to \S+ closed: ` + regexp.QuoteMeta(want) +
		`2 inline \(1 of them above NCCL_SOCKET_INLINE, alone in flight\), 2 striped in 4 chunks over 2 streams, ` +
		`(\d+) of the chunks moved by helpers and (\d+) by NCCL's thread; (\d+) helper wake-ups`)
	recvRe := regexp.MustCompile(`receive connection from \S+ closed: ` + regexp.QuoteMeta(want) +
		`2 inline, 2 striped in 4 chunks over 2 streams, (\d+) of the chunks moved by helpers and (\d+) by NCCL's thread`)
	for _, re := range []*regexp.Regexp{sendRe, recvRe} {
		m := re.FindStringSubmatch(out)
		if !assert.NotNil(t, m, "no line matching %s in:\n%s", re, out) {
			continue
		}
		byHelpers, _ := strconv.Atoi(m[1])
		byNCCL, _ := strconv.Atoi(m[2])
		assert.Equal(t, 4, byHelpers+byNCCL, "every chunk was moved by someone")
	}
}

// Without data streams every payload goes inline whatever its size: none of
// them went inline by the idle rule, and the summary must not say so.
func TestCloseSummaryWithoutStreams(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "0"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	s, r := pair(t, tr)
	sizes := []int{64 << 10}
	src, dst, rqs := postRecvs(t, r, sizes, 1, 5)
	sq, err := s.Isend(bufPtr(src), len(src), 1, 0)
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for sd, rd := false, false; !sd || !rd; runtime.Gosched() {
		require.True(t, time.Now().Before(deadline), "the message never completed")
		if !sd {
			sd, _, err = s.Test(sq)
			require.NoError(t, err)
		}
		if !rd {
			rd, err = r.Test(rqs[0], []int{0})
			require.NoError(t, err)
		}
	}
	require.Equal(t, src, dst)
	require.NoError(t, s.Close())
	assert.Contains(t, log.String(), "closed: 1 messages, 65536 bytes; 1 inline (0 of them above NCCL_SOCKET_INLINE, "+
		"alone in flight), 0 striped in 0 chunks over 0 streams")
}
