package report

import (
	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/proto"
)

// currentEpoch is the epoch the live report shows; ok is false before any.
func (l *State) CurrentEpoch() (e int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.info.Epoch, l.ep != nil
}

// published counts the steps published so far (all epochs, each once).
func (l *State) PublishedSteps() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stepsPublished
}

// quarantineCounts returns epoch e's quarantined samples by reason.
func (l *State) QuarantineCounts(e int) map[string]int64 {
	l.mu.Lock()
	q := l.quarant[e]
	l.mu.Unlock()
	if q == nil {
		return map[string]int64{}
	}
	return q.Counts()
}

// quarantineGroups returns epoch e's quarantined samples by reason, with examples.
func (l *State) quarantineGroups(e int) map[string]balancer.QuarantineGroup {
	l.mu.Lock()
	q := l.quarant[e]
	l.mu.Unlock()
	if q == nil {
		return nil
	}
	return pipeline.QuarantineReasons(q)
}

// withEpochQuarantine returns a copy of rep with the quarantine of rep's
// epoch only (the run report's epoch files).
func (l *State) WithEpochQuarantine(rep *balancer.Report) *balancer.Report {
	c := *rep
	c.QuarantineReasons = l.quarantineGroups(c.Epoch)
	c.Quarantined = 0
	for _, g := range c.QuarantineReasons {
		c.Quarantined += int(g.Count)
	}
	return &c
}

// epochList returns the epochs the run record holds, in order.
func (l *State) EpochList() []int { return l.record.epochList() }

// Unmeasured reports whether the run record holds a step in [from, to) that
// was published and that not every rank reported yet: its last feedback is
// still in flight after the acks, or some rank never sends it.
func (l *State) Unmeasured(from, to proto.Pos) bool { return l.record.unmeasured(from, to) }

// measuredEpochs returns the run record's measured figures of every epoch,
// in epoch order.
func (l *State) MeasuredEpochs() []EpochMeasured { return l.record.summary() }
