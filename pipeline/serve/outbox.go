package serve

import (
	"context"
	"sync"

	"github.com/mmfeed/mmfeed/proto"
)

// outItem is one encoded batch held for a rank on the core data plane.
type outItem struct {
	key     proto.BatchKey
	gen     int
	payload []byte
	sum     uint32 // CRC-32C of payload, computed once
	sent    bool   // a fetch for it was answered
}

// outbox holds the encoded batches of every rank on the core data plane, in
// plan order per rank, from the moment they are built until the rank
// acknowledges them (or a rewind purges them). It owns its lock; its byte
// bound is the backpressure between preprocessing and the trainers. Safe for
// concurrent use.
type outbox struct {
	mu      sync.Mutex
	ranks   [][]*outItem
	bytes   int64
	max     int64
	changed chan struct{} // closed and replaced on every change (put's wait for room)
	// rankChanged[r] is closed and replaced on every change of rank r's
	// batches: a fetch waits on its own rank's, so a change wakes only
	// that rank's fetches, not every rank's (at 1,024 ranks a shared channel
	// woke thousands of fetches for each of the thousands of changes of a
	// step: docs/BENCHMARKS.md, "Control plane at scale").
	rankChanged []chan struct{}
	// wanted counts, per rank, the fetches waiting for a batch not held yet.
	wanted []map[proto.BatchKey]int
}

func newOutbox(ranks int, maxBytes int64) *outbox {
	o := &outbox{ranks: make([][]*outItem, ranks), max: maxBytes, changed: make(chan struct{}),
		wanted: make([]map[proto.BatchKey]int, ranks), rankChanged: make([]chan struct{}, ranks)}
	for r := range o.wanted {
		o.wanted[r] = map[proto.BatchKey]int{}
		o.rankChanged[r] = make(chan struct{})
	}
	return o
}

// want records that a fetch of rank waits for key until the returned func
// is called: put admits key and the batches before it over the bound.
func (o *outbox) want(rank int, key proto.BatchKey) (done func()) {
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
func (o *outbox) wantedLocked(rank int, key proto.BatchKey) bool {
	for k := range o.wanted[rank] {
		if !keyLess(k, key) {
			return true
		}
	}
	return false
}

// notifyLocked wakes put's waits and, for rank ≥ 0, rank's fetches.
func (o *outbox) notifyLocked(rank int) {
	close(o.changed)
	o.changed = make(chan struct{})
	if rank >= 0 {
		close(o.rankChanged[rank])
		o.rankChanged[rank] = make(chan struct{})
	}
}

// put adds a batch for rank. It waits while the outbox is over its bound,
// unless the rank holds no batch its trainer has not fetched yet, or a fetch
// of the rank waits for this batch or a later one: a trainer that waits for
// its next batch always gets it, so trainers that hold a step while they
// wait for each other cannot stall the service, and neither can batches a
// trainer will never fetch (after a takeover the new leader rebuilds from
// the last recorded position, and the trainer already has those batches).
func (o *outbox) put(ctx context.Context, rank int, it *outItem) error {
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

func (o *outbox) unsentLocked(rank int) bool {
	for _, it := range o.ranks[rank] {
		if !it.sent {
			return true
		}
	}
	return false
}

// lookup returns the batch of rank with key (marking it sent), or nil and a
// channel that is closed at the next change of rank's batches.
func (o *outbox) lookup(rank int, key proto.BatchKey) (*outItem, <-chan struct{}) {
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

// peek returns the batch of rank with key, or nil, without marking it sent.
func (o *outbox) peek(rank int, key proto.BatchKey) *outItem {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, it := range o.ranks[rank] {
		if it.key == key {
			return it
		}
	}
	return nil
}

// first returns the position of the first batch held for rank.
func (o *outbox) first(rank int) (proto.BatchKey, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.ranks[rank]) == 0 {
		return proto.BatchKey{}, false
	}
	return o.ranks[rank][0].key, true
}

// ack drops rank's batches up to and including key.
func (o *outbox) ack(rank int, key proto.BatchKey) {
	o.mu.Lock()
	defer o.mu.Unlock()
	q := o.ranks[rank]
	n := 0
	for n < len(q) && !keyLess(key, q[n].key) {
		o.bytes -= int64(len(q[n].payload))
		q[n] = nil
		n++
	}
	if n > 0 {
		o.ranks[rank] = q[n:]
		o.notifyLocked(rank)
	}
}

// purge drops everything held for rank (a rewind).
func (o *outbox) purge(rank int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, it := range o.ranks[rank] {
		o.bytes -= int64(len(it.payload))
	}
	o.ranks[rank] = nil
	o.notifyLocked(rank)
}

// size returns the bytes held.
func (o *outbox) size() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bytes
}

// keyLess orders the batches of one rank: (epoch, step, micro-batch).
func keyLess(a, b proto.BatchKey) bool {
	if a.Epoch != b.Epoch {
		return a.Epoch < b.Epoch
	}
	if a.Step != b.Step {
		return a.Step < b.Step
	}
	return a.MicroBatch < b.MicroBatch
}
