package deliver

import (
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// FetchWait bounds how long a fetch waits for its batch to be built; the
// rank asks again after its own timeout.
const FetchWait = 2 * time.Minute

// FetchWaits keeps one waiting fetch per batch of one rank. A fetch for a
// batch another fetch already waits for joins it: the waiter answers the
// newest fetch's reply subject (a restarted trainer's new inbox) and waits
// up to FetchWait from the newest fetch. Safe for concurrent use; its lock
// is a leaf.
type FetchWaits struct {
	mu sync.Mutex
	m  map[proto.BatchKey]*Waiter
}

// Waiter is the fetch that waits for one batch, with the reply subject
// and the deadline of the newest fetch that joined it.
type Waiter struct {
	reply    string
	deadline time.Time
}

// NewFetchWaits keeps no wait yet.
func NewFetchWaits() *FetchWaits { return &FetchWaits{m: map[proto.BatchKey]*Waiter{}} }

// Join returns a new waiter for key, or nil when one exists: that one now
// answers reply and waits until FetchWait after now.
func (f *FetchWaits) Join(key proto.BatchKey, reply string, now time.Time) *Waiter {
	f.mu.Lock()
	defer f.mu.Unlock()
	if w := f.m[key]; w != nil {
		w.reply, w.deadline = reply, now.Add(FetchWait)
		return nil
	}
	w := &Waiter{reply: reply, deadline: now.Add(FetchWait)}
	f.m[key] = w
	return w
}

// Claim ends w's wait to answer it and returns the reply subject to send
// to: a fetch after it starts a new wait.
func (f *FetchWaits) Claim(key proto.BatchKey, w *Waiter) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m[key] == w {
		delete(f.m, key)
	}
	return w.reply
}

// Left returns how long w may still wait; at 0 its wait has ended.
func (f *FetchWaits) Left(key proto.BatchKey, w *Waiter, now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := w.deadline.Sub(now)
	if d <= 0 {
		d = 0
		if f.m[key] == w {
			delete(f.m, key)
		}
	}
	return d
}

// Leave ends w's wait without an answer.
func (f *FetchWaits) Leave(key proto.BatchKey, w *Waiter) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m[key] == w {
		delete(f.m, key)
	}
}
