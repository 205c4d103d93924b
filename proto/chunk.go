package proto

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/nats-io/nats.go"
)

// HeaderBudget is the room ChunkSize leaves for headers in every message.
// The largest header set this package writes (64-byte job, 10-digit numbers)
// is under 600 bytes; a test guards that.
const HeaderBudget = 1024

// MinChunkSize is the smallest data size per message ChunkSize accepts.
const MinChunkSize = 4096

// ChunkSize returns the data bytes per message for a connection whose
// server allows maxPayload bytes (nc.MaxPayload()), headers included.
func ChunkSize(maxPayload int64) (int, error) {
	n := maxPayload - HeaderBudget
	if n < MinChunkSize {
		return 0, fmt.Errorf("proto: server max_payload %d leaves %d < %d bytes per chunk: %w", maxPayload, n, MinChunkSize, ErrTooLarge)
	}
	return int(min(n, 1<<30)), nil
}

// Chunk splits payload into messages on the key's batch subject, each with
// at most chunkSize data bytes and the full header set. Data slices alias
// payload (no copy); keep payload unchanged until the messages are sent.
func Chunk(key BatchKey, gen int, payload []byte, chunkSize int) ([]*nats.Msg, error) {
	return ChunkSum(key, gen, payload, Checksum(payload), chunkSize)
}

// ChunkSum is Chunk with the payload's CRC-32C computed by the caller (once
// per payload, however often it is sent).
func ChunkSum(key BatchKey, gen int, payload []byte, sum uint32, chunkSize int) ([]*nats.Msg, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	subj, _ := key.Subject()
	if chunkSize <= 0 || len(payload) == 0 || gen < 0 {
		return nil, fmt.Errorf("proto: chunk %v: chunk size %d, payload %d bytes, gen %d: %w", key, chunkSize, len(payload), gen, ErrInvalidMeta)
	}
	n := (len(payload) + chunkSize - 1) / chunkSize
	if n > 1<<31-1 {
		return nil, fmt.Errorf("proto: chunk %v: %d chunks: %w", key, n, ErrTooLarge)
	}
	h := ChunkHeader{BatchKey: key, Gen: gen, Count: n, Size: int64(len(payload)), Checksum: sum}
	msgs := make([]*nats.Msg, n)
	for i := range n {
		h.Index = i
		end := min((i+1)*chunkSize, len(payload))
		msgs[i] = &nats.Msg{Subject: subj, Header: h.Header(), Data: payload[i*chunkSize : end]}
	}
	return msgs, nil
}

// Assembled is what a Reassembler gives back for a batch: on success the
// verified payload, on failure the header and error; in both cases Tags of
// every message that belonged to the batch (duplicates included), so a
// consumer can acknowledge or terminate them.
type Assembled[T any] struct {
	Header ChunkHeader // Index is 0
	// Payload is nil unless complete and verified. A single-chunk batch's
	// Payload is that chunk's data slice, not a copy.
	Payload []byte
	Tags    []T
	// Duplicate: a chunk of a batch that was already completed (a
	// redelivery); Tags holds just that message, Payload is nil.
	Duplicate bool
}

// ReassemblerConfig bounds a Reassembler.
type ReassemblerConfig struct {
	// MaxBatchBytes is the largest payload accepted (Mmfeed-Size).
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

type partial[T any] struct {
	head    ChunkHeader
	parts   [][]byte
	have    int
	bytes   int64
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
// alone: Assembled is nil and err wraps ErrHeader.
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
		r.evictIfFull()
		p = r.open(id, h)
	}
	if err := r.put(p, h, data, tag); err != nil {
		return r.fail(id, err)
	}
	if p.have < p.head.Count {
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
		old.key, p.have, p.head.Count, r.cfg.MaxPending, ErrChunkMissing))
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

func (r *Reassembler[T]) open(id batchID, h ChunkHeader) *partial[T] {
	head := h
	head.Index = 0
	p := &partial[T]{head: head, parts: make([][]byte, h.Count), started: time.Now()}
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
	if old := p.parts[h.Index]; old != nil {
		if r.cfg.Strict || !bytes.Equal(old, data) {
			return fmt.Errorf("proto: batch %v chunk %d/%d arrived twice: %w", h.BatchKey, h.Index, h.Count, ErrChunkDuplicate)
		}
		return nil
	}
	if p.bytes+int64(len(data)) > p.head.Size {
		return fmt.Errorf("proto: batch %v chunk %d/%d: %d bytes overflow the announced size %d: %w",
			h.BatchKey, h.Index, h.Count, len(data), p.head.Size, ErrChunkMismatch)
	}
	p.parts[h.Index] = data
	p.have++
	p.bytes += int64(len(data))
	return nil
}

func (r *Reassembler[T]) finish(id batchID) (*Assembled[T], error) {
	p := r.pending[id]
	r.drop(id)
	if p.bytes != p.head.Size {
		return &Assembled[T]{Header: p.head, Tags: p.tags}, fmt.Errorf("proto: batch %v: %d bytes in %d chunks, header says %d: %w",
			id.key, p.bytes, p.head.Count, p.head.Size, ErrChunkMismatch)
	}
	payload, sum := join(p.parts, p.bytes)
	if sum != p.head.Checksum {
		return &Assembled[T]{Header: p.head, Tags: p.tags}, fmt.Errorf("proto: batch %v: crc32c %08x, header says %08x: %w",
			id.key, sum, p.head.Checksum, ErrChecksum)
	}
	r.remember(id.key)
	return &Assembled[T]{Header: p.head, Payload: payload, Tags: p.tags}, nil
}

// joinBlock is the block join copies and checksums at a time: the checksum
// reads what the copy just brought into the cache.
const joinBlock = 64 << 10

// join returns the concatenated parts and their CRC-32C. A single part is
// returned as is (no copy); several are copied into one new buffer with the
// checksum computed on the way, one pass over the data instead of two.
func join(parts [][]byte, size int64) ([]byte, uint32) {
	if len(parts) == 1 {
		return parts[0], Checksum(parts[0])
	}
	out := make([]byte, 0, size)
	var sum uint32
	for _, part := range parts {
		for len(part) > 0 {
			n := min(len(part), joinBlock)
			out = append(out, part[:n]...)
			sum = crc32.Update(sum, castagnoli, part[:n])
			part = part[n:]
		}
	}
	return out, sum
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
		a, err := r.fail(id, fmt.Errorf("proto: batch %v: %d of %d chunks after %v: %w", id.key, p.have, p.head.Count, maxAge, ErrChunkMissing))
		out = append(out, Expired[T]{Assembled: a, Err: err})
	}
	return out
}

// Expired is one batch failed by Expire.
type Expired[T any] struct {
	*Assembled[T]
	Err error
}

// Reassemble strictly reassembles the messages of exactly one batch, in any
// order: every chunk once, all headers consistent, size and checksum right.
// It returns the header (Index 0) and the payload.
func Reassemble(msgs []*nats.Msg, maxBatchBytes int64) (ChunkHeader, []byte, error) {
	r, err := NewReassembler[int](ReassemblerConfig{MaxBatchBytes: maxBatchBytes, MaxPending: 1, Strict: true})
	if err != nil {
		return ChunkHeader{}, nil, err
	}
	if len(msgs) == 0 {
		return ChunkHeader{}, nil, fmt.Errorf("proto: reassemble: no messages: %w", ErrChunkMissing)
	}
	var first *ChunkHeader
	for i, m := range msgs {
		h, err := ParseChunkHeader(m.Header)
		if err != nil {
			return ChunkHeader{}, nil, fmt.Errorf("proto: reassemble: message %d: %w", i, err)
		}
		if first == nil {
			first = &h
		} else if h.BatchKey != first.BatchKey || h.Gen != first.Gen {
			return ChunkHeader{}, nil, fmt.Errorf("proto: reassemble: message %d is batch %v, want %v: %w", i, h.BatchKey, first.BatchKey, ErrChunkMismatch)
		}
		a, err := r.Add(m.Header, m.Data, i)
		if err != nil {
			return ChunkHeader{}, nil, err
		}
		if a != nil {
			if i != len(msgs)-1 {
				return ChunkHeader{}, nil, fmt.Errorf("proto: reassemble: %d messages after the batch completed: %w", len(msgs)-1-i, ErrChunkDuplicate)
			}
			return a.Header, a.Payload, nil
		}
	}
	p := r.pending[batchID{first.BatchKey, first.Gen}]
	return ChunkHeader{}, nil, fmt.Errorf("proto: reassemble %v: %d of %d chunks: %w", first.BatchKey, p.have, p.head.Count, ErrChunkMissing)
}
