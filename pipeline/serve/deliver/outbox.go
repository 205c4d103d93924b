package deliver

import (
	"context"
	"sync"

	"github.com/mmfeed/mmfeed/proto"
)

// Item is one encoded batch held for a rank on the core data plane.
type Item struct {
	key     proto.BatchKey
	gen     int
	payload []byte
	sum     uint32 // CRC-32C of payload, computed once
	sent    bool   // a fetch for it was answered
}

// NewItem is the batch key of generation gen, encoded as payload.
func NewItem(key proto.BatchKey, gen int, payload []byte) *Item {
	return &Item{key: key, gen: gen, payload: payload, sum: proto.Checksum(payload)}
}

// Key is the batch's key.
func (it *Item) Key() proto.BatchKey { return it.key }

// Gen is the generation the batch was built for.
func (it *Item) Gen() int { return it.gen }

// Payload is the encoded batch; the caller must not modify it.
func (it *Item) Payload() []byte { return it.payload }

// Sum is the CRC-32C of the payload.
func (it *Item) Sum() uint32 { return it.sum }

// Outbox holds the encoded batches of every rank on the core data plane, in
// plan order per rank, from the moment they are built until the rank
// acknowledges them (or a rewind purges them). It owns its lock; its byte
// bound is the backpressure between preprocessing and the trainers. Safe for
// concurrent use.
type Outbox struct {
	mu      sync.Mutex
	ranks   [][]*Item
	bytes   int64
	max     int64
	changed chan struct{} // closed and replaced on every change (Put's wait for room)
	// rankChanged[r] is closed and replaced on every change of rank r's
	// batches: a fetch waits on its own rank's, so a change wakes only
	// that rank's fetches, not every rank's (at 1,024 ranks a shared channel
	// woke thousands of fetches for each of the thousands of changes of a
	// step: docs/BENCHMARKS.md, "Control plane at scale").
	rankChanged []chan struct{}
	// wanted counts, per rank, the fetches waiting for a batch not held yet.
	wanted []map[proto.BatchKey]int
}

// NewOutbox holds the batches of ranks ranks, up to maxBytes (see Put).
func NewOutbox(ranks int, maxBytes int64) *Outbox {
	o := &Outbox{ranks: make([][]*Item, ranks), max: maxBytes, changed: make(chan struct{}),
		wanted: make([]map[proto.BatchKey]int, ranks), rankChanged: make([]chan struct{}, ranks)}
	for r := range o.wanted {
		o.wanted[r] = map[proto.BatchKey]int{}
		o.rankChanged[r] = make(chan struct{})
	}
	return o
}

// Want records that a fetch of rank waits for key until the returned func
// is called: Put admits key and the batches before it over the bound.
func (o *Outbox) Want(rank int, key proto.BatchKey) (done func()) {
	o.mu.Lock()
	o.wanted[rank][key]++
	o.notifyLocked(-1)
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.wanted[rank][key]--; o.wanted[rank][key] <= 0 {
			delete(o.wanted[rank], key)
		}
	}
}

// wantedLocked reports whether a fetch of rank waits for key or a later
// batch: the publisher puts in plan order, so it must put key to get there.
func (o *Outbox) wantedLocked(rank int, key proto.BatchKey) bool {
	for k := range o.wanted[rank] {
		if !KeyLess(k, key) {
			return true
		}
	}
	return false
}

// notifyLocked wakes Put's waits and, for rank ≥ 0, rank's fetches.
func (o *Outbox) notifyLocked(rank int) {
	close(o.changed)
	o.changed = make(chan struct{})
	if rank >= 0 {
		close(o.rankChanged[rank])
		o.rankChanged[rank] = make(chan struct{})
	}
}

// Put adds a batch for rank. It waits while the outbox is over its bound,
// unless the rank holds no batch its trainer has not fetched yet, or a fetch
// of the rank waits for this batch or a later one: a trainer that waits for
// its next batch always gets it, so trainers that hold a step while they
// wait for each other cannot stall the service, and neither can batches a
// trainer will never fetch (after a takeover the new leader rebuilds from
// the last recorded position, and the trainer already has those batches).
func (o *Outbox) Put(ctx context.Context, rank int, it *Item) error {
	for {
		o.mu.Lock()
		if o.bytes+int64(len(it.payload)) <= o.max || !o.unsentLocked(rank) || o.wantedLocked(rank, it.key) {
			o.ranks[rank] = append(o.ranks[rank], it)
			o.bytes += int64(len(it.payload))
			o.notifyLocked(rank)
			o.mu.Unlock()
			return nil
		}
		ch := o.changed
		o.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (o *Outbox) unsentLocked(rank int) bool {
	for _, it := range o.ranks[rank] {
		if !it.sent {
			return true
		}
	}
	return false
}

// Lookup returns the batch of rank with key (marking it sent), or nil and a
// channel that is closed at the next change of rank's batches.
func (o *Outbox) Lookup(rank int, key proto.BatchKey) (*Item, <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, it := range o.ranks[rank] {
		if it.key == key {
			if !it.sent {
				it.sent = true
				o.notifyLocked(rank)
			}
			return it, nil
		}
	}
	return nil, o.rankChanged[rank]
}

// Peek returns the batch of rank with key, or nil, without marking it sent.
func (o *Outbox) Peek(rank int, key proto.BatchKey) *Item {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, it := range o.ranks[rank] {
		if it.key == key {
			return it
		}
	}
	return nil
}

// First returns the position of the first batch held for rank.
func (o *Outbox) First(rank int) (proto.BatchKey, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.ranks[rank]) == 0 {
		return proto.BatchKey{}, false
	}
	return o.ranks[rank][0].key, true
}

// Ack drops rank's batches up to and including key.
func (o *Outbox) Ack(rank int, key proto.BatchKey) {
	o.mu.Lock()
	defer o.mu.Unlock()
	q := o.ranks[rank]
	n := 0
	for n < len(q) && !KeyLess(key, q[n].key) {
		o.bytes -= int64(len(q[n].payload))
		q[n] = nil
		n++
	}
	if n > 0 {
		o.ranks[rank] = q[n:]
		o.notifyLocked(rank)
	}
}

// Purge drops everything held for rank (a rewind).
func (o *Outbox) Purge(rank int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, it := range o.ranks[rank] {
		o.bytes -= int64(len(it.payload))
	}
	o.ranks[rank] = nil
	o.notifyLocked(rank)
}

// Size returns the bytes held.
func (o *Outbox) Size() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bytes
}

// KeyLess orders the batches of one rank: (epoch, step, micro-batch).
func KeyLess(a, b proto.BatchKey) bool {
	if a.Epoch != b.Epoch {
		return a.Epoch < b.Epoch
	}
	if a.Step != b.Step {
		return a.Step < b.Step
	}
	return a.MicroBatch < b.MicroBatch
}
