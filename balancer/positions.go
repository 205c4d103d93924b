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
// a global batch of one micro-batch per rank (subs[j], a sub-partitioner;
// the chunks concurrently on large batches); rank r's micro-batch j is its
// share of chunk j. A chunk spans a narrow length range, so its
// micro-batches pad little. Nil when a chunk cannot be split within the
// budget.
func (jb *job) positionsFirst(order []int32, subs []*Partitioner) [][]int32 {
	dp, m := jb.cfg.DP, jb.cfg.MicroBatches
	if len(subs) != m {
		return nil
	}
	out := make([][]int32, dp*m)
	var w pending
	failed := make([]bool, m)
	for j, chunk := range jb.positionChunks(order) {
		w.run(jb.parallel(), func() { failed[j] = !jb.splitChunk(subs[j], chunk, j, out) })
	}
	w.wait()
	if slices.Contains(failed, true) || !jb.fits(out) {
		return nil
	}
	return out
}

// splitChunk splits chunk over the ranks with sub and writes rank r's share
// to out[r*M+j]; false when the budget cannot hold it.
func (jb *job) splitChunk(sub *Partitioner, chunk []int32, j int, out [][]int32) bool {
	items := make([]Item, len(chunk))
	costs := make([]Cost, len(chunk))
	for i, pos := range chunk {
		items[i], costs[i] = jb.items[pos], jb.costs[pos]
	}
	a, err := sub.Partition(items, costs)
	if err != nil {
		return false
	}
	m := jb.cfg.MicroBatches
	for r := range jb.cfg.DP {
		mb := a.MicroBatch(r, 0)
		for i, k := range mb {
			mb[i] = chunk[k]
		}
		out[r*m+j] = mb
	}
	return true
}

// positionChunks cuts order into MicroBatches contiguous chunks of about
// equal unpadded step cost, each with at least DP items.
func (jb *job) positionChunks(order []int32) [][]int32 {
	dp, m := jb.cfg.DP, jb.cfg.MicroBatches
	pl := jb.cfg.Placement
	n := len(order)
	var remaining float64
	for _, pos := range order {
		remaining += pl.StepCost(jb.costs[pos])
	}
	out := make([][]int32, 0, m)
	start := 0
	for j := range m {
		target := remaining / float64(m-j)
		end, acc := start, 0.0
		for end < n-dp*(m-1-j) {
			c := pl.StepCost(jb.costs[order[end]])
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

// byCostOrder returns the positions sorted by unpadded step cost (ties by
// position): positionsFirst over it puts the costliest samples at the same
// micro-batch position on every rank.
func (jb *job) byCostOrder() []int32 {
	if jb.cfg.Placement == Colocated {
		return slices.Clone(jb.ranked.byCost)
	}
	return costOrder(jb.stepCost)
}

// levelPositions lowers syncedCost of the loaded groups by moving one sample,
// or swapping two, between the costliest and the cheapest micro-batches at
// the same position (j-th costliest of their ranks), positions with the
// widest spread first; it takes the first exchange that lowers syncedCost
// and starts over, until none does or the budget is spent. Budgets hold and
// micro-batches stay non-empty.
func (jb *job) levelPositions(sc *padScratch) {
	budget := levelBudget * len(jb.items)
	cur := jb.syncedCost(sc)
	for budget > 0 {
		improved := false
		jb.syncedTops(sc)
		for _, pair := range jb.positionPairs(sc) {
			var ok bool
			if cur, ok = jb.levelPair(sc, pair[0], pair[1], cur, &budget); ok {
				improved = true
				break
			}
		}
		if !improved {
			return
		}
	}
}

// syncedTops fills sc.posTop: per position j, the three largest j-th
// costliest micro-batch costs of the ranks (syncedCost's terms), so that
// syncedCostWith can price a change of two ranks in O(M log M).
func (jb *job) syncedTops(sc *padScratch) {
	m, pl := jb.cfg.MicroBatches, jb.cfg.Placement
	sc.posTop = slices.Grow(sc.posTop[:0], m)[:m]
	clear(sc.posTop)
	buf := make([]float64, m)
	for r := range jb.cfg.DP {
		for j := range m {
			buf[j] = pl.StepCost(sc.groups[r*m+j].cost)
		}
		slices.Sort(buf)
		for j := range m {
			sc.posTop[j].add(buf[m-1-j], r)
		}
	}
}

// syncedCostWith returns syncedCost when only ranks ra ≠ rb changed since
// syncedTops: their micro-batches at their current costs, every other
// rank's from sc.posTop. It gives syncedCost's value to the last bit (the
// same maxima, summed in the same order).
func (jb *job) syncedCostWith(sc *padScratch, ra, rb int) float64 {
	m, pl := jb.cfg.MicroBatches, jb.cfg.Placement
	sc.slotMax = slices.Grow(sc.slotMax[:0], 2*m)[:2*m]
	a, b := sc.slotMax[:m], sc.slotMax[m:]
	for j := range m {
		a[j] = pl.StepCost(sc.groups[ra*m+j].cost)
		b[j] = pl.StepCost(sc.groups[rb*m+j].cost)
	}
	slices.Sort(a)
	slices.Sort(b)
	var s float64
	for j := range m {
		s += max(sc.posTop[j].without(ra, rb), a[m-1-j], b[m-1-j])
	}
	return s
}

// positionPairs returns, per position, the slots of its costliest and its
// cheapest micro-batch, the widest spread first.
func (jb *job) positionPairs(sc *padScratch) [][2]int {
	dp, m, pl := jb.cfg.DP, jb.cfg.MicroBatches, jb.cfg.Placement
	hi, lo := make([]int, m), make([]int, m)
	idx := make([]int, m)
	for r := range dp {
		for j := range idx {
			idx[j] = r*m + j
		}
		slices.SortFunc(idx, func(a, b int) int {
			return cmp.Compare(pl.StepCost(sc.groups[b].cost), pl.StepCost(sc.groups[a].cost))
		})
		for j, g := range idx {
			c := pl.StepCost(sc.groups[g].cost)
			if r == 0 || c > pl.StepCost(sc.groups[hi[j]].cost) {
				hi[j] = g
			}
			if r == 0 || c < pl.StepCost(sc.groups[lo[j]].cost) {
				lo[j] = g
			}
		}
	}
	out := make([][2]int, 0, m)
	for j := range m {
		if hi[j]/m != lo[j]/m {
			out = append(out, [2]int{hi[j], lo[j]})
		}
	}
	spread := func(x [2]int) float64 {
		return pl.StepCost(sc.groups[x[0]].cost) - pl.StepCost(sc.groups[x[1]].cost)
	}
	slices.SortStableFunc(out, func(a, b [2]int) int { return cmp.Compare(spread(b), spread(a)) })
	return out
}

// levelPair tries the moves of a sample of group a to group b and the swaps
// of a sample of a with one of b, keeping the first that lowers syncedCost
// below cur; it returns the new cost and whether it changed anything.
func (jb *job) levelPair(sc *padScratch, a, b int, cur float64, budget *int) (float64, bool) {
	ga, gb := &sc.groups[a], &sc.groups[b]
	for i := len(ga.members) - 1; i >= 0 && len(ga.members) > 1; i-- {
		if c, ok := jb.tryExchange(sc, a, b, i, -1, cur, budget); ok {
			return c, true
		}
		for k := range gb.members {
			if c, ok := jb.tryExchange(sc, a, b, i, k, cur, budget); ok {
				return c, true
			}
			if *budget <= 0 {
				return cur, false
			}
		}
	}
	return cur, false
}

// tryExchange prices moving member i of group a to group b (k < 0) or
// swapping it with member k of b (a and b of different ranks), and makes
// the exchange when the budget holds and syncedCost falls below
// cur·(1 − minGain). sc.posTop must describe the groups before it. The
// trial shapes are priced as refresh would compute them after the exchange
// (the same complexity sums, in member order, unless the cost does not see
// complexity: jb.shapePriced), so the decision is the one a full
// recomputation gives.
func (jb *job) tryExchange(sc *padScratch, a, b, i, k int, cur float64, budget *int) (float64, bool) {
	*budget--
	ga, gb := &sc.groups[a], &sc.groups[b]
	x := jb.items[ga.members[i]]
	var na, nb mbShape
	if k < 0 {
		na = ga.without(x)
		nb = gb.shape().with(x)
		if !jb.shapePriced {
			na.complexity = jb.cplxSum(ga.members, i, -1)
		}
	} else {
		y := jb.items[gb.members[k]]
		na, nb = ga.without(x).with(y), gb.without(y).with(x)
		if !jb.shapePriced {
			na.complexity = jb.cplxSum(ga.members, i, gb.members[k])
			nb.complexity = jb.cplxSum(gb.members, k, ga.members[i])
		}
	}
	bud := jb.cfg.Budget
	if !bud.Fits(na.count, na.maxL, na.sumP) || !bud.Fits(nb.count, nb.maxL, nb.sumP) {
		return cur, false
	}
	ca, cb := ga.cost, gb.cost
	ga.cost, gb.cost = jb.padCost(na), jb.padCost(nb)
	m := jb.cfg.MicroBatches
	c := jb.syncedCostWith(sc, a/m, b/m)
	ga.cost, gb.cost = ca, cb
	if c >= cur*(1-minGain) {
		return cur, false
	}
	xp := ga.members[i]
	if k < 0 {
		ga.members = slices.Delete(ga.members, i, i+1)
		gb.members = append(gb.members, xp)
	} else {
		ga.members[i], gb.members[k] = gb.members[k], xp
	}
	jb.refresh(sc, a)
	jb.refresh(sc, b)
	jb.rankCost(sc, a/m)
	jb.rankCost(sc, b/m)
	return c, true
}

// cplxSum returns Σ complexity over members in order, with member i
// replaced by the item at position with (with < 0: left out), as refresh
// would sum it after the exchange.
func (jb *job) cplxSum(members []int32, i int, with int32) float64 {
	var s float64
	for j, pos := range members {
		if j == i {
			if with < 0 {
				continue
			}
			pos = with
		}
		s += jb.items[pos].Complexity
	}
	return s
}

// fitsGroup reports whether group g is within the budget.
func (jb *job) fitsGroup(sc *padScratch, g int) bool {
	s := sc.groups[g].shape()
	return jb.cfg.Budget.Fits(s.count, s.maxL, s.sumP)
}
