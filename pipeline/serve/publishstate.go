package serve

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/mmfeed/mmfeed/proto"
)

// rewindReq asks the publisher to publish rank's batches again from to, with
// a new generation.
type rewindReq struct {
	rank   int
	to     pos
	reason string
	done   chan error // nil: nobody waits
}

// publisher owns what the publish loop (publish.go) shares with the rest of
// the service: the rewinds asked of it, its wake-ups, the cancel of the run
// in progress, and whether every batch is published.
//
// Invariants:
//   - only the loop applies rewinds, between runs; a run does not start
//     while one is queued, and a rewind queued during a run cancels it, so
//     the loop applies it at once;
//   - finished only turns true;
//   - sinceCal and built belong to the loop's goroutine.
type publisher struct {
	rewinds chan rewindReq
	wake    chan struct{} // a trainer moved or a rewind was queued

	mu        sync.Mutex
	cancelRun context.CancelFunc // the run in progress; nil between runs
	finished  bool

	warnedRoom atomic.Bool // checkStreamRoom warned
	sinceCal   int         // steps published since the last recalibration
	// built, when set (tests), is called after each batch is handed to the
	// data plane.
	built func(proto.BatchKey)
}

func newPublisher() *publisher {
	return &publisher{rewinds: make(chan rewindReq, 64), wake: make(chan struct{}, 1)}
}

// request queues a rewind and stops the current run so the loop applies it
// at once.
func (p *publisher) request(ctx context.Context, req rewindReq) error {
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
	p.poke()
	return nil
}

// poke wakes a loop that waits for the trainers.
func (p *publisher) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// startRun registers the run's cancel; false when a rewind is queued (the
// loop applies it first).
func (p *publisher) startRun(cancel context.CancelFunc) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.rewinds) > 0 {
		return false
	}
	p.cancelRun = cancel
	return true
}

func (p *publisher) endRun() {
	p.mu.Lock()
	p.cancelRun = nil
	p.mu.Unlock()
}

// finish records that every batch is published; it reports whether that is
// news.
func (p *publisher) finish() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	first := !p.finished
	p.finished = true
	return first
}

// isFinished reports whether every batch of the job was published.
func (p *publisher) isFinished() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.finished
}
