package plugin

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// A buffer NCCL passes is NULL only for 0 bytes. Before the glue checked it,
// the socket transport read a message meant for a NULL receive buffer, threw
// it away and had test report its size as received; a NULL send failed the
// whole connection with EFAULT ("bad address").
func TestNullBufferWithBytesIsInvalidArgument(t *testing.T) {
	sink := initWith(t, &fakeTransport{name: "nullbuf", devs: 1})
	send, recv, sh, _ := connectPair(t)
	_, res := netIsend(sh, nil, 100, 0, 0, 0)
	assert.Equal(t, nccl.InvalidArgument, res, "isend of 100 bytes from NULL")
	require.NotEmpty(t, sink.warns())
	assert.Contains(t, sink.warns()[len(sink.warns())-1], "NULL buffer for a message of 100 bytes")
	assert.Zero(t, send.send.(*fakeSend).next, "the transport must not see the send")

	err := recv.setRecvBuf("irecv", 2, nil, 4096, 0, 0)
	require.Error(t, err)
	assert.Equal(t, nccl.InvalidArgument, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), "irecv buffer 2 is NULL with size 4096")

	// 0 bytes may come with a NULL buffer, as NCCL's zero-byte operations do.
	req, res := netIsend(sh, nil, 0, 0, 0, 0)
	require.Equal(t, nccl.Success, res)
	assert.NotZero(t, req)
	assert.NoError(t, recv.setRecvBuf("irecv", 0, nil, 0, 0, 0))
}

// A registration is a real range of memory. One that wraps past the end of
// the address space reached the transport, and ib's MR cache answered it
// with a handle of an unrelated registration
// (ib's TestRegMrRangeThatWrapsIsInvalidArgument).
func TestRegMrRangeThatWrapsIsInvalidArgument(t *testing.T) {
	sink := initWith(t, &fakeTransport{name: "wrap", devs: 1})
	_, _, sh, rh := connectPair(t)
	last := ^uintptr(0) &^ 0xfff
	top := unsafe.Add(unsafe.Pointer(nil), last) // the last page
	for _, h := range []uintptr{sh, rh} {
		before := len(sink.warns())
		mh, res := netRegMr(h, top, 8192, int(nccl.PtrHost))
		assert.Equal(t, nccl.InvalidArgument, res)
		assert.Zero(t, mh)
		require.Greater(t, len(sink.warns()), before, "a rejected registration must WARN")
		assert.Contains(t, sink.warns()[len(sink.warns())-1], "wraps past the end of the address space")
		mh, res = netRegMrDmaBuf(h, top, 1<<20, int(nccl.PtrCUDA), 0, 3)
		assert.Equal(t, nccl.InvalidArgument, res)
		assert.Zero(t, mh)
		// A size_t of 2^63 or more arrives as a negative int.
		_, res = netRegMr(h, top, -1, int(nccl.PtrHost))
		assert.Equal(t, nccl.InvalidArgument, res)
		assert.Contains(t, sink.warns()[len(sink.warns())-1], "18446744073709551615")
		// The last byte of the address space is still a range.
		mh, res = netRegMr(h, top, 4095, int(nccl.PtrHost))
		assert.Equal(t, nccl.Success, res)
		assert.NotZero(t, mh)
	}
}
