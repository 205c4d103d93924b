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
