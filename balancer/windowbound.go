package balancer

import (
	"cmp"
	"slices"
)

// WindowLowerBoundSum returns a lower bound on Σ over the plan's windowed
// steps of the step cost (StepStats.MaxCost) for any plan that, like the
// redeal, may move samples between the steps of a lookahead window (keeping
// each step's sample count). It sums, over the epoch's windows, the largest
// of these bounds on Σ over the window's W steps, for every additive part f
// of the cost (the total, or under modality placement vision + fusion and
// text + fusion):
//
//   - Σf / dp: every step costs at least its mean rank;
//   - every step costs at least its costliest sample, and Σ of the steps'
//     costliest samples is least when the costliest samples share the largest
//     steps: f₁ + f_(n₁+1) + f_(n₁+n₂+1) + … with n₁ ≥ n₂ ≥ … the steps' counts;
//   - under micro-batch sync, a step costs at least Σ over its M positions of
//     the costliest sample there, and each of the window's W·M (step,
//     position) slots holds at least dp samples: Σ over slots of their
//     costliest sample is least when one slot takes the costliest and the
//     others the cheapest in groups of dp: f₁ + Σ_{i<W·M} f_(N−i·dp+1);
//
// plus W·M × f(overhead) (packed plans). The padded tail step, planned
// alone, contributes its own StepCostLowerBound. 0 for pipelined plans
// (PP > 1) and for the baselines, which have no windows.
//
// It holds for the whole window, not only for the planned split of it, so
// Σ IdealCost over it bounds the epoch efficiency of any choice of each
// step's samples the lookahead allows.
func (p *Plan) WindowLowerBoundSum() float64 {
	c := p.Config
	if c.Strategy != StrategyMmfeed || c.PP > 1 || len(p.Steps) == 0 {
		return 0
	}
	m := c.model()
	var overhead Cost
	if c.Pack {
		overhead = m.MicroBatchOverhead
	}
	steps := p.Steps
	var sum float64
	if last := steps[len(steps)-1]; hasPadding(last) {
		var entries []Cost
		for _, r := range last.Ranks {
			for _, mb := range r {
				for _, e := range mb {
					entries = append(entries, m.Cost(p.items[e.Item]))
				}
			}
		}
		sum += StepCostLowerBound(entries, len(last.Ranks), c.MicroBatches, c.Placement, c.Sync, overhead)
		steps = steps[:len(steps)-1]
	}
	first := 0
	if len(steps) > 0 {
		first = steps[0].Index
	}
	for start, size := range windows(first+len(steps), max(c.Lookahead, 1)) {
		lo, hi := max(start, first)-first, start+size-first
		if hi <= 0 {
			continue
		}
		sum += p.windowBound(m, steps[lo:hi], overhead)
	}
	return sum
}

// windowBound is WindowLowerBoundSum's bound for one window's steps.
func (p *Plan) windowBound(m CostModel, steps []Step, overhead Cost) float64 {
	c := p.Config
	var costs []Cost
	var counts []int
	for _, s := range steps {
		n := 0
		for _, r := range s.Ranks {
			for _, mb := range r {
				for _, e := range mb {
					costs = append(costs, m.Cost(p.items[e.Item]))
					n++
				}
			}
		}
		counts = append(counts, n)
	}
	slices.SortFunc(counts, func(a, b int) int { return cmp.Compare(b, a) })
	dp, slots := c.DP, len(steps)*c.MicroBatches
	s := make([]float64, len(costs))
	var lb float64
	for _, part := range costParts(c.Placement) {
		total := partValues(s, costs, part)
		b := total / float64(dp)
		var heads float64
		at := 0
		for _, n := range counts {
			if at < len(s) {
				heads += s[at]
			}
			at += n
		}
		b = max(b, heads)
		if c.Sync == SyncMicroBatch && len(s) >= slots*dp {
			t := s[0]
			for i := 1; i < slots; i++ {
				t += s[len(s)-i*dp]
			}
			b = max(b, t)
		}
		lb = max(lb, b+float64(slots)*part(overhead))
	}
	return lb
}

func hasPadding(s Step) bool {
	for _, r := range s.Ranks {
		for _, mb := range r {
			for _, e := range mb {
				if e.Weight == 0 {
					return true
				}
			}
		}
	}
	return false
}
