// Package ibv is the verbs.Provider on the real libibverbs. The library is
// opened at run time with dlopen (NCCL_IBVERBS_LIB, libibverbs.so or
// libibverbs.so.1, as the transport tries them) and every non-inline verb is
// resolved with dlvsym on its IBVERBS_1.x version, so nothing links against -libverbs and a host
// without rdma-core still loads the plugin. Optional verbs (dma-buf
// registration, reg_mr_iova2, ECE) are probed and reported in Features.
//
// The static-inline data-path verbs (ibv_post_send, ibv_post_recv,
// ibv_poll_cq) are compiled into shim.c against <infiniband/verbs.h> (Debian
// package libibverbs-dev) and called once per chain of work requests or per
// batch of completions.
package ibv
