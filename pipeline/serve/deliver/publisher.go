package deliver

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// Rewind asks the publisher to publish Rank's batches again from To, with
// a new generation.
type Rewind struct {
	Rank   int
	To     proto.Pos
	Reason string
	Done   chan error // nil: nobody waits; else it gets the rewind's error (nil once applied)
}

// RewindParts is what applying a rewind needs besides the rank table: the
// data plane's drop and the service's record of it (a counter, a log line).
type RewindParts interface {
	// Drop drops everything the data plane holds for rank.
	Drop(ctx context.Context, rank int) error
	// Rewound records that req was applied: rank moved to generation gen.
	Rewound(req Rewind, gen int)
	// RewindFailed records that req could not be applied.
	RewindFailed(req Rewind, err error)
}

// Publisher owns what the publish loop shares with the rest of the service:
// the rewinds asked of it, its wake-ups, the cancel of the run in progress,
// and whether every batch is published.
//
// Invariants:
//   - only the loop applies rewinds (Drain, Apply), between runs; a run does
//     not start while one is queued (StartRun), and a rewind queued during a
//     run cancels it, so the loop applies it at once;
//   - Finish only turns Finished true;
//   - the recalibration count (RecalibrationDue) belongs to the loop's
//     goroutine.
type Publisher struct {
	rewinds chan Rewind
	wake    chan struct{} // a trainer moved or a rewind was queued

	mu        sync.Mutex
	cancelRun context.CancelFunc // the run in progress; nil between runs
	finished  bool

	warnedRoom atomic.Bool // the stream-room warning was given
	sinceCal   int         // steps published since the last recalibration
	// built, when set (tests), is called after each batch is handed to the
	// data plane.
	built func(proto.BatchKey)
}

// NewPublisher returns a publisher with no rewind queued and no run.
func NewPublisher() *Publisher {
	return &Publisher{rewinds: make(chan Rewind, 64), wake: make(chan struct{}, 1)}
}

// Request queues a rewind and stops the current run so the loop applies it
// at once.
func (p *Publisher) Request(ctx context.Context, req Rewind) error {
	select {
	case p.rewinds <- req:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.mu.Lock()
	if p.cancelRun != nil {
		p.cancelRun()
	}
	p.mu.Unlock()
	p.Poke()
	return nil
}

// Poke wakes a loop that waits for the trainers.
func (p *Publisher) Poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Rewinds is the queue of the rewinds asked (the loop's).
func (p *Publisher) Rewinds() <-chan Rewind { return p.rewinds }

// Woken is ready after a Poke (the loop's).
func (p *Publisher) Woken() <-chan struct{} { return p.wake }

// StartRun registers the run's cancel; false when a rewind is queued (the
// loop applies it first).
func (p *Publisher) StartRun(cancel context.CancelFunc) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.rewinds) > 0 {
		return false
	}
	p.cancelRun = cancel
	return true
}

// EndRun forgets the run's cancel.
func (p *Publisher) EndRun() {
	p.mu.Lock()
	p.cancelRun = nil
	p.mu.Unlock()
}

// Finish records that every batch is published; it reports whether that is
// news.
func (p *Publisher) Finish() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	first := !p.finished
	p.finished = true
	return first
}

// Finished reports whether every batch of the job was published.
func (p *Publisher) Finished() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.finished
}

// RoomWarned reports whether the stream-room warning was given.
func (p *Publisher) RoomWarned() bool { return p.warnedRoom.Load() }

// ClaimRoomWarning reports whether the caller is the one to give the
// stream-room warning (once).
func (p *Publisher) ClaimRoomWarning() bool { return p.warnedRoom.CompareAndSwap(false, true) }

// RecalibrationDue counts one published step and reports whether every
// steps were counted since the last recalibration and planned() holds (a
// replan needs the whole epoch planned); then the count restarts. Loop's
// goroutine only.
func (p *Publisher) RecalibrationDue(every int, planned func() bool) bool {
	p.sinceCal++
	if p.sinceCal < every || !planned() {
		return false
	}
	p.sinceCal = 0
	return true
}

// SetBuilt sets the hook called after each batch is handed to the data
// plane (tests); before the service starts.
func (p *Publisher) SetBuilt(f func(proto.BatchKey)) { p.built = f }

// Built calls the hook SetBuilt set, if any.
func (p *Publisher) Built(k proto.BatchKey) {
	if p.built != nil {
		p.built(k)
	}
}

// Drain applies the queued rewinds; it returns ctx's error.
func (p *Publisher) Drain(ctx context.Context, ranks *Ranks, parts RewindParts) error {
	for {
		select {
		case req := <-p.rewinds:
			p.Apply(ctx, req, ranks, parts)
		default:
			return ctx.Err()
		}
	}
}

// Apply purges what the data plane still holds for the rank, moves it to a
// new generation (recorded before anything is published with it, so a
// restarted service never reuses a purged message id) and sets its cursor;
// it answers req.Done.
func (p *Publisher) Apply(ctx context.Context, req Rewind, ranks *Ranks, parts RewindParts) {
	err := rewind(ctx, req, ranks, parts)
	if err != nil {
		parts.RewindFailed(req, err)
	}
	if req.Done != nil {
		req.Done <- err
	}
}

func rewind(ctx context.Context, req Rewind, ranks *Ranks, parts RewindParts) error {
	rs := ranks.Get(req.Rank)
	if rs.Cursor().Less(req.To) {
		return nil // nothing published from there yet (at the cursor, a step may be part published)
	}
	kctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := parts.Drop(kctx, req.Rank); err != nil {
		return err
	}
	gen := rs.Gen() + 1
	if err := ranks.Rewound(kctx, req.Rank, gen, req.To); err != nil {
		return err
	}
	parts.Rewound(req, gen)
	return nil
}
