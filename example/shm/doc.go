// Package shm is the SDK example: a complete NCCL net transport for ranks on the
// same host, written against package nccl and built into its own
// libnccl-net-shm.so by cmd/libnccl-net-shm and scripts/build-plugin.sh. Being
// inside this module, it also uses a few of its internal helpers (the settings
// registry, the clock, the request pool, the handle table); a vendor module
// uses nccl.Env and its own small equivalents instead.
//
// It owns the shared-memory protocol. Each connection is one file in
// NCCL_GO_SHM_DIR (default /dev/shm) that the listener creates and the
// connector maps; the file is unlinked as soon as the connection is accepted
// or the listener closed. A listener killed before either leaves its file:
// its connector removes it on seeing the listener dead, and otherwise the
// next Init of any process using the directory (or a Listen that finds it
// full) does, once neither end's lock (below) is held by a live process. So
// a finished or crashed job leaves nothing behind once both ends are gone.
//
// Connection set-up never blocks. The handle carries the file's path and a
// random 32-byte secret; the connector proves it knows the secret with an
// HMAC over a nonce the listener wrote into the file, and the listener answers
// with its own HMAC, so neither side trusts a file or a peer that merely
// guessed a name.
//
// The data path is receiver driven, like NCCL's IB transport: Irecv publishes
// the posted buffers (sizes and tags) in a 32-slot clear-to-send FIFO; Isend
// matches the oldest published receive, picks the buffer with its tag and
// queues a descriptor; the payload then streams through a bounded byte ring
// (NCCL_GO_SHM_RING_SIZE) in descriptor order, copied in by the sender's
// Isend/Test and out by the receiver's Test. A send larger than its buffer is
// refused on both sides with ncclInvalidUsage and nothing is written. Every
// data-path call is a handful of atomic loads and bounded memcpy: no locks, no
// allocation, no waiting.
//
// Liveness, not progress: each end holds a POSIX lock on its side of the file
// while its process lives, so a killed peer is seen at once (its kernel drops
// the lock) and a frozen or slow one stays alive, in any PID namespace. A peer
// that closed its end is noticed as soon as the data it left behind has been
// consumed. Connection set-up is bounded by NCCL_GO_TIMEOUT.
package shm
