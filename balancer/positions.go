package balancer

import (
	"cmp"
	"slices"
)

// positionsFirst is the candidate for SyncMicroBatch: the ranks meet at every
// micro-batch, so what must be even is each position's micro-batches across
// the ranks, not only the ranks' totals. It cuts the grouping order (sorted by
// length, or by image size) into MicroBatches contiguous chunks of about equal
// unpadded cost, at least DP items each, and splits chunk j over the ranks as
// a global batch of one micro-batch per rank (a sub-partitioner); rank r's
// micro-batch j is its share of chunk j. A chunk spans a narrow length range,
// so its micro-batches pad little. Nil when a chunk cannot be split within
// the budget.
func (p *Partitioner) positionsFirst(order []int32) [][]int32 {
	dp, m := p.cfg.DP, p.cfg.MicroBatches
	sub, err := p.subPartitioner()
	if err != nil {
		return nil
	}
	out := make([][]int32, dp*m)
	var items []Item
	var costs []Cost
	for j, chunk := range p.positionChunks(order) {
		items, costs = items[:0], costs[:0]
		for _, pos := range chunk {
			items, costs = append(items, p.items[pos]), append(costs, p.costs[pos])
		}
		a, err := sub.Partition(items, costs)
		if err != nil {
			return nil
		}
		for r := range dp {
			mb := a.MicroBatch(r, 0)
			for i, k := range mb {
				mb[i] = chunk[k]
			}
			out[r*m+j] = mb
		}
	}
	if !p.fits(out) {
		return nil
	}
	return out
}

// positionChunks cuts order into MicroBatches contiguous chunks of about
// equal unpadded step cost, each with at least DP items.
func (p *Partitioner) positionChunks(order []int32) [][]int32 {
	dp, m := p.cfg.DP, p.cfg.MicroBatches
	pl := p.cfg.Placement
	n := len(order)
	var remaining float64
	for _, pos := range order {
		remaining += pl.StepCost(p.costs[pos])
	}
	out := make([][]int32, 0, m)
	start := 0
	for j := range m {
		target := remaining / float64(m-j)
		end, acc := start, 0.0
		for end < n-dp*(m-1-j) {
			c := pl.StepCost(p.costs[order[end]])
			if j < m-1 && end-start >= dp && acc+c/2 > target {
				break
			}
			acc += c
			end++
		}
		out = append(out, order[start:end:end])
		remaining -= acc
		start = end
	}
	return out
}

// subPartitioner returns the partitioner positionsFirst splits a chunk with:
// the same ranks, budget, placement and model, one micro-batch per rank.
func (p *Partitioner) subPartitioner() (*Partitioner, error) {
	if p.sub == nil {
		cfg := p.cfg
		cfg.MicroBatches, cfg.Sync = 1, SyncStep
		sub, err := NewPartitioner(cfg)
		if err != nil {
			return nil, err
		}
		p.sub = sub
	}
	return p.sub, nil
}

// byCostOrder returns the positions sorted by unpadded step cost (ties by
// position): positionsFirst over it puts the costliest samples at the same
// micro-batch position on every rank.
func (p *Partitioner) byCostOrder() []int32 {
	pl := p.cfg.Placement
	out := make([]int32, len(p.items))
	for i := range out {
		out[i] = int32(i)
	}
	slices.SortFunc(out, func(a, b int32) int {
		if c := cmp.Compare(pl.StepCost(p.costs[a]), pl.StepCost(p.costs[b])); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	return out
}
