package deliver

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/internal/ctxutil"
	"github.com/mmfeed/mmfeed/proto"
)

// KeyHanded is the KV key of every rank's handed step (RanksRecord: Ranks[r]
// is the last step rank r was handed a batch of, null when none): one
// write records the steps of all the ranks whose fetches were answered
// meanwhile (group commit), instead of one write per rank and step
// (rank.<dp>.<mp>.handed, which services before it wrote and a service
// still reads when this key is absent).
const KeyHanded = "handed"

// RanksRecord is the value of KeyHanded and of KeyPositions: a step per rank
// (index dp × mp + mp rank).
type RanksRecord struct {
	Ranks []*KVStep `json:"ranks"`
}

// handedLog owns the KeyHanded record: what the KV bucket holds and what the
// next write will hold. A rank's step is recorded before any batch of it is
// sent (Ranks.Hand waits for record), so the rule "a position advances
// only over batches handed to that rank" survives a restart unchanged; only
// the number of writes changes. While one write is in flight, the steps of
// other ranks gather and go out together in the next, and a write starts
// at least handedInterval after the one before: a job writes the record at
// most 1/handedInterval times a second, whatever its rank count (a rank's
// fetch window hides the wait; a fetch when none was written for that long
// is recorded at once). Safe for concurrent use.
type handedLog struct {
	interval time.Duration // the least time between two writes' starts
	last     time.Time     // when the last write started

	mu      sync.Mutex
	want    []*KVStep     // the next write's value
	have    []*KVStep     // what the bucket holds
	writing bool          // a write is in flight
	done    chan struct{} // closed when that write ends
	err     error         // the last write's error
}

// handedInterval is the least time between two writes of KeyHanded.
const handedInterval = 100 * time.Millisecond

func newHandedLog(ranks int) *handedLog {
	return &handedLog{interval: handedInterval, want: make([]*KVStep, ranks), have: make([]*KVStep, ranks), done: make(chan struct{})}
}

// loaded sets what the bucket holds for rank r (a restart).
func (l *handedLog) loaded(r int, h *KVStep) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.want[r], l.have[r] = h, h
}

// reset forgets every rank's step (a resize: the old layout's ranks were
// handed those); the next write records the new layout's only.
func (l *handedLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.want)
}

func covers(h *KVStep, at proto.Pos) bool {
	return h != nil && !(proto.Pos{Epoch: h.Epoch, Step: h.Step}).Less(at)
}

// record returns once the bucket holds step at (or a later one) for rank r,
// writing it together with every other rank's step waiting then; err is
// the write's that was to record it.
func (l *handedLog) record(ctx context.Context, st Store, r int, at proto.Pos) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !covers(l.want[r], at) {
		l.want[r] = &KVStep{at.Epoch, at.Step}
	}
	for !covers(l.have[r], at) {
		if l.writing {
			done := l.done
			l.mu.Unlock()
			select {
			case <-done:
			case <-ctx.Done():
				l.mu.Lock()
				return fmt.Errorf("serve: record rank %d handed %v: %w", r, at, ctx.Err())
			}
			l.mu.Lock()
			if l.err != nil && !covers(l.have[r], at) {
				return l.err // the write meant to record it failed: the caller does not send
			}
			continue
		}
		l.writing = true
		wait := l.interval - time.Since(l.last)
		l.mu.Unlock()
		var err error
		if wait > 0 {
			err = ctxutil.Sleep(ctx, wait) // the steps of other ranks gather meanwhile
		}
		l.mu.Lock()
		var snap []*KVStep
		if err == nil {
			snap = slices.Clone(l.want)
			l.last = time.Now()
			l.mu.Unlock()
			err = st.PutJSON(ctx, KeyHanded, RanksRecord{Ranks: snap})
			l.mu.Lock()
		}
		l.writing, l.err = false, err
		if snap == nil {
			l.err = nil // this caller's wait ended, not a write: the others write themselves
		}
		if err == nil {
			for i, h := range snap {
				if h != nil && !covers(l.have[i], proto.Pos{Epoch: h.Epoch, Step: h.Step}) {
					l.have[i] = h
				}
			}
		}
		close(l.done)
		l.done = make(chan struct{})
		if err != nil {
			return err
		}
	}
	return nil
}
