package balancer

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Blocker explains a planned step that no split of its samples can bring
// within ImbalanceTarget (its ImbalanceLowerBound is above it): the
// costliest sample, how large it is next to the step's fair shares, and the
// settings that would lower the bound, each with the bound it would give.
type Blocker struct {
	Step  int     `json:"step"`
	Bound float64 `json:"imbalance_lower_bound"`
	// Item is the step's costliest sample and ID its id.
	Item        int32  `json:"item"`
	ID          string `json:"id"`
	TextTokens  int    `json:"text_tokens"`
	ImageTokens int    `json:"image_tokens"`
	// RankShare is its cost over the step's mean rank cost and
	// MicroBatchShare over the mean micro-batch cost (a rank's share over
	// MicroBatches): above 1, under micro-batch sync no split is even.
	RankShare       float64 `json:"rank_share"`
	MicroBatchShare float64 `json:"micro_batch_share"`
	// Fixes are the settings that would lower the bound, best first.
	Fixes []Fix `json:"fixes"`
}

// Fix is one setting and the step's imbalance lower bound under it.
type Fix struct {
	Setting string  `json:"setting"`
	Bound   float64 `json:"imbalance_lower_bound"`
}

// MaxBlockers is how many Blockers a report lists (the worst bounds).
const MaxBlockers = 8

// Blockers returns up to n of the plan's steps whose imbalance lower bound
// is above ImbalanceTarget, the worst first (ties by step), each explained.
// stats are p.Stats().
func (p *Plan) Blockers(stats []StepStats, n int) []Blocker {
	var out []Blocker
	for k, st := range stats {
		if st.ImbalanceLowerBound <= ImbalanceTarget || st.MeanCost <= 0 {
			continue
		}
		out = append(out, p.blocker(p.Steps[k], st))
	}
	slices.SortFunc(out, func(a, b Blocker) int { return cmp.Or(cmp.Compare(b.Bound, a.Bound), cmp.Compare(a.Step, b.Step)) })
	return out[:min(n, len(out))]
}

func (p *Plan) blocker(s Step, st StepStats) Blocker {
	c := p.Config
	m := c.model()
	var entries []Cost
	top, topCost := int32(-1), 0.0
	for _, r := range s.Ranks {
		for _, mb := range r {
			for _, e := range mb {
				entries = append(entries, m.Cost(p.items[e.Item]))
				if c := p.ItemCost(e.Item); e.Weight > 0 && (top < 0 || c > topCost) {
					top, topCost = e.Item, c
				}
			}
		}
	}
	it := p.items[top]
	mb := max(c.MicroBatches, 1)
	b := Blocker{Step: s.Index, Bound: st.ImbalanceLowerBound, Item: top, ID: it.ID,
		TextTokens: it.TextTokens, ImageTokens: it.ImageTokens,
		RankShare: topCost / st.MeanCost, MicroBatchShare: topCost * float64(mb) / st.MeanCost}
	var overhead Cost
	if c.Pack {
		overhead = m.MicroBatchOverhead
	}
	bound := func(m int, sync Sync) float64 {
		return max(1, StepCostLowerBound(entries, len(s.Ranks), m, c.Placement, sync, overhead)/st.MeanCost)
	}
	if c.Sync == SyncMicroBatch {
		b.Fixes = append(b.Fixes, Fix{"--sync step", bound(mb, SyncStep)})
		for k := mb - 1; k >= 1; k-- {
			if lb := bound(k, c.Sync); lb < b.Bound || k == 1 {
				b.Fixes = append(b.Fixes, Fix{fmt.Sprintf("--micro-batches %d", k), lb})
				break
			}
		}
	}
	if it.ImageTokens > it.TextTokens {
		b.Fixes = append(b.Fixes, Fix{"--max-pixels (caps its image tokens)", 0})
	}
	b.Fixes = append(b.Fixes, Fix{"a larger --lookahead (stacks more costly samples with it)", 0})
	slices.SortStableFunc(b.Fixes, func(x, y Fix) int { return cmp.Compare(boundOrInf(x), boundOrInf(y)) })
	return b
}

// boundOrInf orders fixes with a computed bound before those without (0).
func boundOrInf(f Fix) float64 {
	if f.Bound == 0 {
		return 1e300
	}
	return f.Bound
}

// String is one line per blocker for the report table.
func (b Blocker) String() string {
	var fixes []string
	for _, f := range b.Fixes {
		if f.Bound > 0 {
			fixes = append(fixes, fmt.Sprintf("%s → %.4f", f.Setting, f.Bound))
		} else {
			fixes = append(fixes, f.Setting)
		}
	}
	return fmt.Sprintf("  step %d (bound %.4f): sample %q, %d text + %d image tokens, costs %.2f× a rank's share and %.2f× a micro-batch's; fixes: %s",
		b.Step, b.Bound, b.ID, b.TextTokens, b.ImageTokens, b.RankShare, b.MicroBatchShare, strings.Join(fixes, "; "))
}
