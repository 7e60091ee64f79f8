// Package ib is the InfiniBand / RoCE verbs transport: NCCL's IB protocol
// (receiver-driven RDMA WRITE with clear-to-send FIFO credits, grouped
// receives, multi-QP striping, GPU-direct flush by loopback RDMA READ,
// virtual NICs fused from several HCAs) written in Go against the verbs
// interface of package ib/verbs.
//
// It owns device discovery (active IB/Ethernet ports filtered by NCCL_IB_HCA,
// RoCE GID selection, sysfs facts through package ib/internal/sysfs), the out-of-band
// TCP handshake that exchanges QP numbers, addresses and FIFO keys, the
// per-device memory-registration cache, the asynchronous-event watchers, and
// the translation of verbs failures into NCCL result codes with WARNs that
// say what to change. docs/ib.md describes the wire formats and every
// setting.
//
// New returns the transport on the real libibverbs (package ib/internal/ibv, loaded
// with dlopen, so a host without rdma-core gets nccl.ErrNoDevice from Init and
// the plugin falls back to sockets). NewWithOptions runs it on any
// verbs.Provider, e.g. the software NIC of package ib/internal/softnic in tests.
//
// Threads: Isend/Irecv/Iflush/Test of one comm come from one NCCL progress
// thread and take no locks; RegMr/DeregMr may run concurrently on the
// service thread and only touch the per-device MR cache (mutex) and the
// lock-free handle table; set-up runs on goroutines polled by
// Connect/Accept, which never block.
package ib
