// Package reqpool is the plugin's request free list: a fixed set of request
// slots a comm hands out as nccl.Request ids. Get and Put are O(1) and never
// allocate or lock, because one thread owns a comm's data path (NCCL's
// progress thread for that comm); a pool is not safe for concurrent use.
package reqpool

// Pool holds n requests of type T with ids 0..n-1.
type Pool[T any] struct {
	items []T
	busy  []bool
	free  []int32 // stack: the most recently freed id (cache-warm) goes out first
}

// New returns a pool of n free requests; the one allocation is here.
func New[T any](n int) *Pool[T] {
	p := &Pool[T]{items: make([]T, n), busy: make([]bool, n), free: make([]int32, n)}
	for i := range p.free {
		p.free[i] = int32(n - 1 - i) // id 0 is handed out first
	}
	return p
}

// Get takes a free request, zeroed. ok is false when every request is in use:
// the caller answers nccl.NoRequest and NCCL retries.
func (p *Pool[T]) Get() (id int, item *T, ok bool) {
	n := len(p.free)
	if n == 0 {
		return -1, nil, false
	}
	id = int(p.free[n-1])
	p.free = p.free[:n-1]
	p.busy[id] = true
	// Already zero: items start zeroed and Put zeroes them.
	return id, &p.items[id], true
}

// At returns request id if it is in use, else nil (an id NCCL should not
// have: out of range, or already put back).
func (p *Pool[T]) At(id int) *T {
	if id < 0 || id >= len(p.items) || !p.busy[id] {
		return nil
	}
	return &p.items[id]
}

// Put returns request id to the pool. It reports false, and does nothing,
// when id is not in use.
func (p *Pool[T]) Put(id int) bool {
	if p.At(id) == nil {
		return false
	}
	p.busy[id] = false
	var zero T
	p.items[id] = zero // drop references (user buffers, errors) now
	p.free = append(p.free, int32(id))
	return true
}

// InUse is the number of requests handed out and not yet put back.
func (p *Pool[T]) InUse() int { return len(p.items) - len(p.free) }

// Cap is the pool's size.
func (p *Pool[T]) Cap() int { return len(p.items) }
