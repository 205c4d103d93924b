package balancer

import (
	"cmp"
	"fmt"
	"slices"
)

// member is an item with the step its global batch arrived in.
type member struct {
	item    int32
	arrival int32
}

func arrivals(bt batch) []member {
	out := make([]member, len(bt.items))
	for i, it := range bt.items {
		out[i] = member{it, int32(bt.arrival)}
	}
	return out
}

// redeal spreads the samples of a lookahead window over its steps so that the
// steps get equal shares of cost: samples by decreasing cost, each to the step
// with the least cost so far that still has room (the step's original sample
// count, or the token budget). Delay is bounded by the window. When the token
// budget cannot be met (or the window has one step) the arrival order is kept.
func (b *builder) redeal(win []batch) [][]member {
	keep := func() [][]member {
		out := make([][]member, len(win))
		for k, bt := range win {
			out[k] = arrivals(bt)
		}
		return out
	}
	if len(win) < 2 {
		return keep()
	}
	var pool []member
	for _, bt := range win {
		pool = append(pool, arrivals(bt)...)
	}
	pl := b.cfg.Placement
	cost := func(m member) float64 { return pl.StepCost(b.costs[m.item]) }
	slices.SortFunc(pool, func(x, y member) int {
		if c := cmp.Compare(cost(y), cost(x)); c != 0 {
			return c
		}
		return cmp.Compare(x.item, y.item)
	})
	out := make([][]member, len(win))
	dp := b.cfg.DP
	load := make([]float64, len(win)*dp) // virtual ranks: step k, rank r at k*dp+r
	tokens := make([]int, len(win))
	suffix := make([]float64, len(pool)+1) // suffix[i]: Σ cost of pool[i:]
	for i := len(pool) - 1; i >= 0; i-- {
		suffix[i] = suffix[i+1] + cost(pool[i])
	}
	for i, m := range pool {
		best, bestLoad := -1, 0.0
		l := b.items[m.item].TextTokens
		// The samples still to come fill every step's remaining room; a
		// virtual rank's projected load counts its share of them at their
		// mean cost, so a step that fills up early is not left light.
		mean := 0.0
		if rest := len(pool) - i - 1; rest > 0 && b.cfg.GlobalTokens == 0 {
			mean = suffix[i+1] / float64(rest)
		}
		for k, bt := range win {
			room := len(out[k]) < len(bt.items)
			if b.cfg.GlobalTokens > 0 {
				room = tokens[k]+l <= b.cfg.GlobalTokens
			}
			if !room {
				continue
			}
			future := float64(len(bt.items)-len(out[k])-1) * mean / float64(dp)
			for v := k * dp; v < (k+1)*dp; v++ {
				if pl := load[v] + future; best < 0 || pl < bestLoad {
					best, bestLoad = v, pl
				}
			}
		}
		if best < 0 {
			return keep()
		}
		k := best / dp
		out[k] = append(out[k], m)
		load[best] += cost(m)
		tokens[k] += l
	}
	for k := range out {
		if len(out[k]) < b.cfg.DP*b.cfg.MicroBatches {
			return keep()
		}
		slices.SortFunc(out[k], func(x, y member) int { return cmp.Compare(x.item, y.item) })
	}
	return out
}

// mmfeedStep partitions one step's members and appends the step. A step with
// fewer members than DP × MicroBatches (the padded tail) is filled with
// zero-weight copies of its cheapest samples.
func (b *builder) mmfeedStep(index int, members []member) error {
	need := b.cfg.DP * b.cfg.MicroBatches
	real := len(members)
	if real == 0 {
		return fmt.Errorf("balancer: step %d is empty: %w", index, ErrTooFewItems)
	}
	if real < need {
		cheap := slices.Clone(members)
		slices.SortFunc(cheap, func(x, y member) int {
			if c := cmp.Compare(b.costs[x.item].Total(), b.costs[y.item].Total()); c != 0 {
				return c
			}
			return cmp.Compare(x.item, y.item)
		})
		for k := 0; len(members) < need; k++ {
			members = append(members, cheap[k%len(cheap)])
		}
	}
	items := make([]Item, len(members))
	costs := make([]Cost, len(members))
	for k, m := range members {
		items[k], costs[k] = b.items[m.item], b.costs[m.item]
	}
	a, err := b.part.Partition(items, costs)
	if err != nil {
		return fmt.Errorf("balancer: step %d: %w", index, err)
	}
	b.plan.Steps = append(b.plan.Steps, b.toStep(index, a, func(pos int32) Entry {
		m := members[pos]
		if int(pos) >= real {
			return Entry{Item: m.item}
		}
		return Entry{Item: m.item, Weight: 1, Delay: int32(index) - m.arrival}
	}))
	return nil
}

// toStep converts an assignment of positions into a Step of entries.
func (b *builder) toStep(index int, a Assignment, entry func(pos int32) Entry) Step {
	n := 0
	for _, mb := range a.Members {
		n += len(mb)
	}
	backing := make([]Entry, 0, n)
	st := Step{Index: index, Ranks: make([][]MicroBatch, a.DP)}
	mbs := make([]MicroBatch, a.DP*a.MicroBatches)
	for r := range a.DP {
		st.Ranks[r] = mbs[r*a.MicroBatches : (r+1)*a.MicroBatches : (r+1)*a.MicroBatches]
		for m := range a.MicroBatches {
			start := len(backing)
			for _, pos := range a.MicroBatch(r, m) {
				backing = append(backing, entry(pos))
			}
			st.Ranks[r][m] = backing[start:len(backing):len(backing)]
		}
	}
	return st
}
