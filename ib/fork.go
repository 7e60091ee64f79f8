package ib

import (
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// forkInit makes registered memory survive the application forking, as
// NCCL's ncclIbInit does with ibv_fork_init before it opens a device.
// PyTorch's DataLoader forks its workers while the job's comms are open: on
// a kernel older than 5.13, a parent that writes to a registered page after
// fork() gets a fresh copy of it while the NIC keeps writing into the old
// one, now the child's, and receives are silently lost. ibv_fork_init has
// libibverbs mark every registration MADV_DONTFORK; newer kernels copy pinned
// pages at fork themselves and it does nothing. It only works before the
// process's first registration, so it runs before any device is opened, and
// a failure (another verbs user in the process registered first) is a WARN
// saying what to set, never a failed Init: NCCL ignores it too.
func (t *Transport) forkInit(p verbs.Provider) {
	st, err := p.ForkInit()
	switch {
	case err != nil && st != verbs.ForkUnneeded && st != verbs.ForkEnabled:
		t.log.Warnf("NET/GoIB : ibv_fork_init failed (%v; fork support %v): memory this process registers is not protected against fork(), and a child forked while comms are open (e.g. DataLoader workers with the fork start method) can take RDMA writes meant for this process; set RDMAV_FORK_SAFE=1 in the job's environment, or run a kernel >= 5.13",
			err, st)
	case st == verbs.ForkUnneeded:
		t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : fork support unneeded: the kernel copies registered pages at fork()")
	default:
		t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : fork support %v: registered memory is marked MADV_DONTFORK (ibv_fork_init)", st)
	}
}
