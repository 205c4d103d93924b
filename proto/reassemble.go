package proto

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/nats-io/nats.go"
)

// Assembled is what a Reassembler gives back for a batch: on success the
// verified payload, on failure the header and error; in both cases Tags of
// every message that belonged to the batch (duplicates included), so a
// consumer can acknowledge or terminate them.
type Assembled[T any] struct {
	Header ChunkHeader // Index is 0
	// Payload is nil unless complete and verified. A single-chunk batch's
	// Payload is that chunk's data slice, not a copy; a multi-chunk batch's
	// is one buffer of Mmfeed-Size bytes that each chunk was copied into as
	// it arrived.
	Payload []byte
	Tags    []T
	// Duplicate: a chunk of a batch that was already completed (a
	// redelivery); Tags holds just that message, Payload is nil.
	Duplicate bool
}

// ReassemblerConfig bounds a Reassembler.
type ReassemblerConfig struct {
	// MaxBatchBytes is the largest payload accepted (Mmfeed-Size). A
	// multi-chunk batch's buffer is allocated at its first chunk, so
	// MaxBatchBytes × MaxPending bounds the memory of incomplete batches.
	MaxBatchBytes int64
	// MaxPending is how many incomplete batches may be open at once; when
	// one more starts, the oldest fails with ErrChunkMissing.
	MaxPending int
	// Strict rejects any repeated chunk with ErrChunkDuplicate; otherwise an
	// identical repeat (a redelivery) is absorbed and only a repeat with
	// different bytes is an error.
	Strict bool
	// Remember is how many completed batch keys are remembered to
	// recognise late redeliveries (Assembled.Duplicate).
	Remember int
}

// DefaultReassemblerConfig returns 1 GiB batches, 8 pending, lenient, 4096
// remembered.
func DefaultReassemblerConfig() ReassemblerConfig {
	return ReassemblerConfig{MaxBatchBytes: 1 << 30, MaxPending: 8, Remember: 4096}
}

// Validate checks the bounds.
func (c ReassemblerConfig) Validate() error {
	if c.MaxBatchBytes <= 0 || c.MaxPending <= 0 || c.Remember < 0 {
		return fmt.Errorf("proto: reassembler config %+v: %w", c, ErrInvalidConfig)
	}
	return nil
}

type batchID struct {
	key BatchKey
	gen int
}

// partial is an incomplete batch. Every chunk but the last has chunk data
// bytes (section 4), so chunk i lands at offset i × chunk of buf as it
// arrives, and the CRC-32C runs over the chunks in index order as far as
// they are contiguous: in the usual in-order arrival each chunk is
// checksummed while its copy is still in the cache, and the batch is
// verified the moment its last chunk lands.
type partial[T any] struct {
	head    ChunkHeader
	buf     []byte // the payload (a single chunk's data, else its own buffer)
	chunk   int64  // data bytes of every chunk but the last
	have    []bool
	n       int    // distinct chunks held
	summed  int    // chunks [0, summed) are in sum
	sum     uint32 // CRC-32C of buf[:summed × chunk]
	tags    []T
	started time.Time
}

// Reassembler collects chunks of interleaved batches and returns each batch
// when its last chunk arrives. Not safe for concurrent use.
type Reassembler[T any] struct {
	cfg     ReassemblerConfig
	pending map[batchID]*partial[T]
	order   []batchID // pending ids, oldest first
	done    map[BatchKey]struct{}
	doneQ   []BatchKey
	evicted []Expired[T]
	held    int
	// alloc returns the buffer of a multi-chunk batch (nil: make).
	alloc func(n int) []byte
}

// NewReassembler returns an empty Reassembler.
func NewReassembler[T any](cfg ReassemblerConfig) (*Reassembler[T], error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Reassembler[T]{cfg: cfg, pending: map[batchID]*partial[T]{}, done: map[BatchKey]struct{}{}}, nil
}

// Pending returns the number of incomplete batches.
func (r *Reassembler[T]) Pending() int { return len(r.pending) }

// Add takes one chunk message (its headers, data and a caller tag). It
// returns nil, nil while the batch is incomplete; a non-nil Assembled when
// the batch completed (Payload set, err nil), failed (err set), or the chunk
// is a late duplicate (Duplicate). A chunk whose headers do not parse fails
// alone: Assembled is nil and err wraps ErrHeader. The data of a chunk of a
// multi-chunk batch is copied; the caller may reuse it when Add returns.
func (r *Reassembler[T]) Add(hd nats.Header, data []byte, tag T) (*Assembled[T], error) {
	h, err := ParseChunkHeader(hd)
	if err != nil {
		return nil, err
	}
	if h.Size > r.cfg.MaxBatchBytes {
		return &Assembled[T]{Header: h, Tags: []T{tag}}, fmt.Errorf("proto: batch %v: size %d > limit %d: %w", h.BatchKey, h.Size, r.cfg.MaxBatchBytes, ErrTooLarge)
	}
	if _, ok := r.done[h.BatchKey]; ok && !r.cfg.Strict {
		return &Assembled[T]{Header: h, Tags: []T{tag}, Duplicate: true}, nil
	}
	if len(data) == 0 || int64(len(data)) > h.Size {
		return nil, fmt.Errorf("proto: batch %v chunk %d/%d: %d data bytes for a %d-byte payload: %w",
			h.BatchKey, h.Index, h.Count, len(data), h.Size, ErrChunkMismatch)
	}
	id := batchID{h.BatchKey, h.Gen}
	p := r.pending[id]
	if p == nil {
		// The first chunk fixes the chunk size, which bounds the count by
		// the size before anything is allocated.
		c, err := chunkSizeOf(h, int64(len(data)))
		if err != nil {
			return &Assembled[T]{Header: h, Tags: []T{tag}}, err
		}
		r.evictIfFull()
		p = r.open(id, h, c)
	}
	if err := r.put(p, h, data, tag); err != nil {
		return r.fail(id, err)
	}
	if p.n < p.head.Count {
		return nil, nil
	}
	return r.finish(id)
}

// evictIfFull fails the oldest pending batch when MaxPending are open; the
// failure is queued for Evicted.
func (r *Reassembler[T]) evictIfFull() {
	if len(r.pending) < r.cfg.MaxPending {
		return
	}
	old := r.order[0]
	p := r.pending[old]
	a, err := r.fail(old, fmt.Errorf("proto: batch %v: %d of %d chunks when %d newer batches had started: %w",
		old.key, p.n, p.head.Count, r.cfg.MaxPending, ErrChunkMissing))
	r.evicted = append(r.evicted, Expired[T]{Assembled: a, Err: err})
}

// Evicted returns (and forgets) the batches failed because MaxPending newer
// batches started before they completed. Check it after every Add.
func (r *Reassembler[T]) Evicted() []Expired[T] {
	e := r.evicted
	r.evicted = nil
	return e
}

// Held returns the number of chunk tags held by incomplete batches.
func (r *Reassembler[T]) Held() int { return r.held }

func (r *Reassembler[T]) open(id batchID, h ChunkHeader, chunk int64) *partial[T] {
	head := h
	head.Index = 0
	p := &partial[T]{head: head, chunk: chunk, have: make([]bool, h.Count), started: time.Now()}
	r.pending[id] = p
	r.order = append(r.order, id)
	return p
}

func (r *Reassembler[T]) put(p *partial[T], h ChunkHeader, data []byte, tag T) error {
	p.tags = append(p.tags, tag)
	r.held++
	if h.Count != p.head.Count || h.Size != p.head.Size || h.Checksum != p.head.Checksum {
		return fmt.Errorf("proto: batch %v chunk %d/%d: count/size/checksum %d/%d/%08x differ from %d/%d/%08x: %w",
			h.BatchKey, h.Index, h.Count, h.Count, h.Size, h.Checksum, p.head.Count, p.head.Size, p.head.Checksum, ErrChunkMismatch)
	}
	off, want := p.span(h.Index)
	if int64(len(data)) != want {
		return fmt.Errorf("proto: batch %v chunk %d/%d: %d data bytes, want %d (chunks of %d bytes, payload %d; truncated or mis-sized): %w",
			h.BatchKey, h.Index, h.Count, len(data), want, p.chunk, p.head.Size, ErrChunkMismatch)
	}
	if p.have[h.Index] {
		if r.cfg.Strict || !bytes.Equal(p.buf[off:off+want], data) {
			return fmt.Errorf("proto: batch %v chunk %d/%d arrived twice: %w", h.BatchKey, h.Index, h.Count, ErrChunkDuplicate)
		}
		return nil
	}
	p.have[h.Index] = true
	p.n++
	if h.Count == 1 {
		p.buf, p.sum, p.summed = data, Checksum(data), 1
		return nil
	}
	if p.buf == nil {
		if r.alloc != nil {
			p.buf = r.alloc(int(p.head.Size))
		} else {
			p.buf = make([]byte, p.head.Size)
		}
	}
	if h.Index == p.summed {
		p.sum = copySum(p.buf[off:], data, p.sum)
		p.summed++
	} else {
		copy(p.buf[off:], data)
	}
	for p.summed < h.Count && p.have[p.summed] {
		o, w := p.span(p.summed)
		p.sum = crc32.Update(p.sum, castagnoli, p.buf[o:o+w])
		p.summed++
	}
	return nil
}

// span returns chunk i's offset and length in the payload.
func (p *partial[T]) span(i int) (int64, int64) {
	off := int64(i) * p.chunk
	return off, min(p.chunk, p.head.Size-off)
}

// chunkSizeOf derives the data bytes per chunk (all but the last) from one
// chunk of n bytes: a chunk before the last has exactly that many; the last
// has what remains, so the others have (size − n) / (count − 1). The count
// must then be ceil(size / chunk).
func chunkSizeOf(h ChunkHeader, n int64) (int64, error) {
	c := n
	if h.Count > 1 && h.Index == h.Count-1 {
		c = (h.Size - n) / int64(h.Count-1)
	}
	if h.Count == 1 {
		c = h.Size
	}
	if c <= 0 || int64(h.Count-1)*c >= h.Size || int64(h.Count)*c < h.Size {
		return 0, fmt.Errorf("proto: batch %v chunk %d/%d: %d data bytes do not cut a %d-byte payload into %d chunks: %w",
			h.BatchKey, h.Index, h.Count, n, h.Size, h.Count, ErrChunkMismatch)
	}
	return c, nil
}

// sumBlock is the block copySum copies and checksums at a time: the checksum
// reads what the copy just brought into the cache.
const sumBlock = 64 << 10

// copySum copies src to dst and returns sum updated with src: one pass over
// the data instead of two.
func copySum(dst, src []byte, sum uint32) uint32 {
	for len(src) > 0 {
		n := min(len(src), sumBlock)
		copy(dst, src[:n])
		sum = crc32.Update(sum, castagnoli, src[:n])
		dst, src = dst[n:], src[n:]
	}
	return sum
}

func (r *Reassembler[T]) finish(id batchID) (*Assembled[T], error) {
	p := r.pending[id]
	r.drop(id)
	if p.summed != p.head.Count || int64(len(p.buf)) != p.head.Size {
		return &Assembled[T]{Header: p.head, Tags: p.tags}, fmt.Errorf("proto: batch %v: %d bytes, %d of %d chunks checksummed, header says %d bytes: %w",
			id.key, len(p.buf), p.summed, p.head.Count, p.head.Size, ErrChunkMismatch)
	}
	if p.sum != p.head.Checksum {
		return &Assembled[T]{Header: p.head, Tags: p.tags}, fmt.Errorf("proto: batch %v: crc32c %08x, header says %08x: %w",
			id.key, p.sum, p.head.Checksum, ErrChecksum)
	}
	r.remember(id.key)
	return &Assembled[T]{Header: p.head, Payload: p.buf, Tags: p.tags}, nil
}

func (r *Reassembler[T]) fail(id batchID, err error) (*Assembled[T], error) {
	p := r.pending[id]
	r.drop(id)
	return &Assembled[T]{Header: p.head, Tags: p.tags}, err
}

func (r *Reassembler[T]) drop(id batchID) {
	r.held -= len(r.pending[id].tags)
	delete(r.pending, id)
	for i, o := range r.order {
		if o == id {
			r.order = append(r.order[:i], r.order[i+1:]...)
			break
		}
	}
}

func (r *Reassembler[T]) remember(k BatchKey) {
	if r.cfg.Remember == 0 {
		return
	}
	if len(r.doneQ) >= r.cfg.Remember {
		delete(r.done, r.doneQ[0])
		r.doneQ = r.doneQ[1:]
	}
	r.done[k] = struct{}{}
	r.doneQ = append(r.doneQ, k)
}

// Expire fails every pending batch whose first chunk arrived more than maxAge
// before now, with ErrChunkMissing.
func (r *Reassembler[T]) Expire(now time.Time, maxAge time.Duration) []Expired[T] {
	var out []Expired[T]
	for _, id := range append([]batchID(nil), r.order...) {
		p := r.pending[id]
		if now.Sub(p.started) <= maxAge {
			continue
		}
		a, err := r.fail(id, fmt.Errorf("proto: batch %v: %d of %d chunks after %v: %w", id.key, p.n, p.head.Count, maxAge, ErrChunkMissing))
		out = append(out, Expired[T]{Assembled: a, Err: err})
	}
	return out
}

// Expired is one batch failed by Expire.
type Expired[T any] struct {
	*Assembled[T]
	Err error
}
