package proto

import "sync"

// bufPool keeps a few payload buffers for reuse, so a rank that receives
// batches of similar sizes copies each multi-chunk batch into memory that is
// already mapped and in use, instead of a fresh allocation the kernel has
// to fault in and the garbage collector has to reclaim. A buffer comes back
// when the last reference to the record decoded from it is released
// (decodeIPC's release), never earlier: arrow's contract that a released
// record's memory may be reused, which Batch.Record documents.
type bufPool struct {
	mu   sync.Mutex
	free [][]byte
	keep int
}

func newBufPool(keep int) *bufPool { return &bufPool{keep: keep} }

// get returns a buffer of n bytes, reused when one of at least n and at most
// 2n bytes is free. Its contents are arbitrary: the caller overwrites it.
func (p *bufPool) get(n int) []byte {
	p.mu.Lock()
	for i, b := range p.free {
		if cap(b) >= n && cap(b) <= 2*n {
			p.free = append(p.free[:i], p.free[i+1:]...)
			p.mu.Unlock()
			return b[:n]
		}
	}
	p.mu.Unlock()
	return make([]byte, n)
}

// put gives b back; beyond keep buffers the oldest is dropped.
func (p *bufPool) put(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) >= p.keep {
		p.free = p.free[1:]
	}
	p.free = append(p.free, b[:cap(b)])
}
