package control

import (
	"log/slog"
	"sync"
	"time"
)

// RateLogEvery is how often a RateLog writes one kind of line at most.
const RateLogEvery = time.Second

// RateLog writes at most one WARN line per kind per RateLogEvery; the lines
// held back meanwhile are counted and reported as "suppressed" on the next
// line of that kind. It bounds the log a flood of refused messages writes
// (they are counted in full on /metrics). Safe for concurrent use; its lock
// is a leaf.
type RateLog struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time // time.Now; tests replace it

	mu   sync.Mutex
	last map[string]time.Time // kind: when its last line was written
	held map[string]int       // kind: lines held back since
}

// NewRateLog returns a RateLog writing to log.
func NewRateLog(log *slog.Logger) *RateLog {
	return &RateLog{log: log, every: RateLogEvery, now: time.Now, last: map[string]time.Time{}, held: map[string]int{}}
}

// Warn writes msg with args as a WARN line unless a line of kind was written
// within every; then it only counts it.
func (r *RateLog) Warn(kind, msg string, args ...any) {
	now := r.now()
	r.mu.Lock()
	if t, ok := r.last[kind]; ok && now.Sub(t) < r.every {
		r.held[kind]++
		r.mu.Unlock()
		return
	}
	n := r.held[kind]
	r.last[kind] = now
	delete(r.held, kind)
	r.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	r.log.Warn(msg, args...)
}
