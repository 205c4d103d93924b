package deliver

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/internal/ctxutil"
)

// KeyPositions is the KV key of every rank's last completed step
// (RanksRecord: Ranks[r] is the last step rank r completed, null when none,
// and it starts at the job's first step). One write records every rank that moved meanwhile, at
// most one write per PositionInterval for the whole job, instead of one
// write per rank and step (rank.<dp>.<mp>.step, which services before it
// wrote and a service still reads when this key is absent or of another
// layout).
const KeyPositions = "positions"

// PositionInterval is the least time between two writes of KeyPositions.
const PositionInterval = 100 * time.Millisecond

// positionLog owns the KeyPositions record. Unlike KeyHanded, nothing waits
// for it: a recorded position is only where a restarted service (or a
// standby taking over) starts a rank before its trainer registers again,
// and a position that lags by a few steps only republishes steps the rank
// acknowledges and drops (docs/protocol.md section 8). It never runs
// ahead: a step is set only once the rank's position moved past it, which
// only acknowledged, handed batches do (invariant 6). Safe for concurrent
// use.
type positionLog struct {
	mu    sync.Mutex
	want  []*KVStep     // the next write's value
	dirty bool          // want differs from what the bucket holds
	kick  chan struct{} // want changed (capacity 1)

	write sync.Mutex // serialises the writes: run's and flush's
}

func newPositionLog(ranks int) *positionLog {
	return &positionLog{want: make([]*KVStep, ranks), kick: make(chan struct{}, 1)}
}

// loaded sets what the bucket holds for rank r (a restart).
func (l *positionLog) loaded(r int, s *KVStep) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.want[r] = s
}

// Set records rank r's last completed step (nil: none) for the next write.
func (l *positionLog) set(r int, s *KVStep) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.want[r]; (w == nil) == (s == nil) && (w == nil || *w == *s) {
		return
	}
	l.want[r], l.dirty = s, true
	l.poke()
}

// poke wakes run (a write is due).
func (l *positionLog) poke() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// run writes the record whenever it changed, at most once per interval,
// until ctx ends. A failed write is tried again at the next interval; the
// guarded KV logs it and marks the service's state unhealthy.
func (l *positionLog) run(ctx context.Context, st Store, interval time.Duration) {
	for {
		select {
		case <-l.kick:
		case <-ctx.Done():
			return
		}
		if l.flush(ctx, st) != nil {
			l.poke()
		}
		if ctxutil.Sleep(ctx, interval) != nil {
			return
		}
	}
}

// flush writes the record now when it changed since the last write.
func (l *positionLog) flush(ctx context.Context, st Store) error {
	l.write.Lock()
	defer l.write.Unlock()
	l.mu.Lock()
	if !l.dirty {
		l.mu.Unlock()
		return nil
	}
	snap := slices.Clone(l.want)
	l.dirty = false
	l.mu.Unlock()
	err := st.PutJSON(ctx, KeyPositions, RanksRecord{Ranks: snap})
	if err != nil {
		l.mu.Lock()
		l.dirty = true
		l.mu.Unlock()
	}
	return err
}
