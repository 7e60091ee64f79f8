// Package softnic is an in-process software RDMA NIC implementing the
// verbs.Provider interface, so the IB transport's whole protocol runs in unit
// tests without RDMA hardware.
//
// It models what the transport relies on from RC queue pairs: RDMA WRITE,
// WRITE_WITH_IMM (consuming a posted receive, completing with the immediate),
// RDMA READ and SEND into registered memory, with lkey/rkey, protection-domain,
// access-flag and bounds checks; completions in posting order per QP; send
// queue slots released only when a later signaled completion is polled (so a
// sender that never signals runs out of queue, as on real hardware); RNR
// waits when no receive is posted; and error semantics: the failing WR
// completes with its error status, the QP enters the error state and every
// later or outstanding WR completes with IBV_WC_WR_FLUSH_ERR.
//
// Several "hosts" (transport instances) share one Fabric, each seeing the
// devices its Provider names; a QP connected to itself (loopback) works too.
// Tests inject failures with Fabric.InjectFault (any WC error status, e.g.
// retry exceeded, or ibv_post_send refusing a WR with Fault.PostErr),
// Fabric.InjectModifyFault (ibv_modify_qp failing, e.g. RTR with ETIMEDOUT
// while a RoCE neighbour is unresolved) and Device.InjectAsyncEvent, and can
// lay out a matching sysfs tree with Fabric.WriteSysfs.
//
// Work requests execute synchronously inside PostSend/PostRecv under one
// fabric-wide mutex: simple, deterministic and free of lock-order problems;
// speed is not the point of the model.
package softnic
