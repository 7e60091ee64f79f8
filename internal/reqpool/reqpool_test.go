package reqpool

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type req struct {
	size int
	data []byte
}

func TestGetPutAndExhaustion(t *testing.T) {
	p := New[req](4)
	assert.Equal(t, 4, p.Cap())
	for i := 0; i < 4; i++ {
		id, r, ok := p.Get()
		require.True(t, ok)
		assert.Equal(t, i, id, "ids in order from a fresh pool")
		r.size = 100 + i
	}
	_, _, ok := p.Get()
	assert.False(t, ok, "exhausted: the caller returns NoRequest")
	assert.Equal(t, 4, p.InUse())
	assert.Equal(t, 102, p.At(2).size)

	require.True(t, p.Put(2))
	assert.Nil(t, p.At(2), "a put-back id is not in use")
	assert.False(t, p.Put(2), "double put")
	assert.False(t, p.Put(-1))
	assert.False(t, p.Put(4))
	assert.Nil(t, p.At(99))
	id, r, ok := p.Get()
	require.True(t, ok)
	assert.Equal(t, 2, id, "the most recently freed id is reused first")
	assert.Equal(t, req{}, *r, "handed out zeroed")
}

func TestPutDropsReferences(t *testing.T) {
	p := New[req](1)
	_, r, _ := p.Get()
	r.data = make([]byte, 10)
	p.Put(0)
	assert.Nil(t, p.items[0].data)
}

func TestNoAllocations(t *testing.T) {
	p := New[req](32)
	n := testing.AllocsPerRun(1000, func() {
		id, r, _ := p.Get()
		r.size = 1
		_ = p.At(id)
		p.Put(id)
	})
	assert.Zero(t, n)
}

func BenchmarkGetPut(b *testing.B) {
	p := New[req](1024)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		id, r, _ := p.Get()
		r.size = i
		p.Put(id)
	}
}
