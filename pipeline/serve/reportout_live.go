package serve

import (
	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline"
)

// currentEpoch is the epoch the live report shows; ok is false before any.
func (l *live) currentEpoch() (e int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.info.Epoch, l.ep != nil
}

// published counts the steps published so far (all epochs, each once).
func (l *live) publishedSteps() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stepsPublished
}

// quarantineCounts returns epoch e's quarantined samples by reason.
func (l *live) quarantineCounts(e int) map[string]int64 {
	l.mu.Lock()
	q := l.quarant[e]
	l.mu.Unlock()
	if q == nil {
		return map[string]int64{}
	}
	return q.Counts()
}

// quarantineGroups returns epoch e's quarantined samples by reason, with examples.
func (l *live) quarantineGroups(e int) map[string]balancer.QuarantineGroup {
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
func (l *live) withEpochQuarantine(rep *balancer.Report) *balancer.Report {
	c := *rep
	c.QuarantineReasons = l.quarantineGroups(c.Epoch)
	c.Quarantined = 0
	for _, g := range c.QuarantineReasons {
		c.Quarantined += int(g.Count)
	}
	return &c
}

// epochList returns the epochs the run record holds, in order.
func (l *live) epochList() []int { return l.record.epochList() }

// partialBefore reports whether the run record holds a step before p that
// some ranks reported and not all.
func (l *live) partialBefore(p pos) bool { return l.record.partialBefore(p) }

// measuredEpochs returns the run record's measured figures of every epoch,
// in epoch order.
func (l *live) measuredEpochs() []EpochMeasured { return l.record.summary() }
