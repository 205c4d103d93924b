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

// planWindow plans one lookahead window's steps, the first of them step
// start, as the redeal deals them.
func (b *builder) planWindow(start int, win []batch) error {
	for k, members := range b.redeal(win) {
		if err := b.mmfeedStep(start+k, members); err != nil {
			return err
		}
	}
	return nil
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
