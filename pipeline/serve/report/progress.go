package report

import (
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// ProgressMeter measures the trainers' rate through one epoch: the steps
// every rank has finished (the least "next needed" position over the ranks)
// since the meter first saw that epoch.
type ProgressMeter struct {
	epoch, step0 int
	t0           time.Time
	last         proto.Pos
	started      bool
}

// ProgressLine is one progress log line's values.
type ProgressLine struct {
	Epoch, Done, Steps int
	Rate               float64       // steps per second since the epoch was first seen
	ETA                time.Duration // to the epoch's end at Rate; -1 while unknown
}

// update records that at now every rank has finished done steps of epoch of
// steps in all. It returns the line to log and false when nothing moved since
// the last line.
func (m *ProgressMeter) Update(epoch, done, steps int, now time.Time) (ProgressLine, bool) {
	p := proto.Pos{Epoch: epoch, Step: done}
	if m.started && p == m.last {
		return ProgressLine{}, false
	}
	if !m.started || epoch != m.epoch {
		m.epoch, m.step0, m.t0, m.started = epoch, done, now, true
	}
	m.last = p
	line := ProgressLine{Epoch: epoch, Done: done, Steps: steps, ETA: -1}
	if dt := now.Sub(m.t0).Seconds(); dt > 0 && done > m.step0 {
		line.Rate = float64(done-m.step0) / dt
		line.ETA = time.Duration(float64(max(steps-done, 0)) / line.Rate * float64(time.Second)).Round(time.Second)
	}
	return line, true
}

// attrs are the log attributes of l; rate and eta are left out while unknown.
func (l ProgressLine) Attrs() []any {
	a := []any{"epoch", l.Epoch, "step", l.Done, "steps", l.Steps, "percent", 100 * l.Done / max(l.Steps, 1)}
	if l.ETA >= 0 {
		a = append(a, "steps_per_s", roundTo(l.Rate, 2), "eta", l.ETA)
	}
	return a
}

func roundTo(v float64, digits int) float64 {
	f := 1.0
	for range digits {
		f *= 10
	}
	return float64(int64(v*f+0.5)) / f
}
