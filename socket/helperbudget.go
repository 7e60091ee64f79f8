package socket

import (
	"sync/atomic"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// helperBudget bounds the stream helpers of the whole process. Each helper is
// an OS thread for as long as its connection is open (an idle one sleeps in
// poll(2), and a goroutine in a system call keeps its thread), and the Go
// runtime aborts the process past 10,000 threads (debug.SetMaxThreads): at
// the default of 4 helpers per connection end, a job holding some 2,500
// connection ends would be killed by its network plugin. A connection that
// finds the budget spent gets fewer helpers or none, and NCCL's thread moves
// those streams' chunks itself, as on a small host; helpers pay off on a few
// busy connections, not on thousands of mostly idle ones.
var helperBudget = budget{limit: maxHelpers}

// maxHelpers is the most stream helpers the process keeps.
const maxHelpers = 1024

type budget struct {
	limit      int64
	used       atomic.Int64
	warned     atomic.Bool
	warnedRoom atomic.Bool
}

// take reserves up to n helpers and returns how many it got; the first
// connection cut short says so, once per process.
//
// It also leaves helperThreadReserve threads of what RLIMIT_NPROC or a cgroup's
// pids.max still allows (threadroom.go): past those the Go runtime cannot
// create a helper's thread and aborts the host process.
func (b *budget) take(n int, log nccl.Logger, peer string) int {
	room, why, limited := threadRoom.Get()()
	for {
		used := b.used.Load()
		got := min(int64(n), b.limit-used)
		if limited {
			got = min(got, int64(room-helperThreadReserve))
		}
		if got < 0 {
			got = 0
		}
		if b.used.CompareAndSwap(used, used+got) {
			if limited && int(got) < n && int64(n) <= b.limit-used && b.warnedRoom.CompareAndSwap(false, true) {
				log.Warnf("%s : %s, so the process may start only %d more threads; the Go runtime aborts the process when it "+
					"cannot create one, so the connection with %s gets %d of its %d stream helpers (keeping %d threads free) and "+
					"NCCL's thread moves the other streams' chunks: raise the limit (ulimit -u, the container's pids limit) "+
					"or set NCCL_GO_SOCKET_HELPERS=0 (said once)",
					logPrefix, why, room, peer, got, n, helperThreadReserve)
			}
			if int64(n) > b.limit-used && b.warned.CompareAndSwap(false, true) {
				log.Infof(nccl.SubsysInit|nccl.SubsysNet, "%s : the process runs %d stream helpers, the most it keeps "+
					"(each holds an OS thread while its connection is open, and the Go runtime aborts past 10,000 threads); "+
					"the connection with %s gets %d of its %d, and this and later connections' other streams are moved by NCCL's thread (said once)",
					logPrefix, b.limit, peer, got, n)
			}
			return int(got)
		}
	}
}

// give returns n helpers to the budget.
func (b *budget) give(n int) { b.used.Add(-int64(n)) }
