package balancer

import "slices"

// dpGroupingLimit bounds K·n for the exact padding-optimal grouping; larger
// batches are dense enough in length that equal-cost cuts already pad little.
const dpGroupingLimit = 1 << 17

// paddingOptimalCuts cuts the length-sorted order into k contiguous
// budget-feasible groups minimising Σ count × longest L, by dynamic programming
// with the divide-and-conquer optimisation: w(j,i) = (i−j)·L[i−1] satisfies the
// quadrangle inequality on sorted lengths, so optimal split points are
// monotone. It returns the k+1 cut positions, or nil when the budget leaves no
// feasible grouping.
func (p *Partitioner) paddingOptimalCuts(k int) []int {
	n := len(p.order)
	const inf = int64(1) << 62
	l := make([]int64, n)
	ps := make([]int, n+1) // prefix Σ P
	for i, pos := range p.order {
		l[i] = int64(p.items[pos].TextTokens)
		ps[i+1] = ps[i] + p.items[pos].ImageTokens
	}
	bud := p.cfg.Budget
	w := func(j, i int) int64 { // group order[j:i], i > j
		if !bud.Fits(i-j, int(l[i-1]), ps[i]-ps[j]) {
			return inf
		}
		return int64(i-j) * l[i-1]
	}
	prev := make([]int64, n+1)
	cur := make([]int64, n+1)
	arg := make([][]int32, k+1)
	for i := range prev {
		prev[i] = inf
	}
	prev[0] = 0
	var solve func(g, lo, hi, optLo, optHi int)
	solve = func(g, lo, hi, optLo, optHi int) {
		if lo > hi {
			return
		}
		mid := (lo + hi) / 2
		best, bestJ := inf, optLo
		for j := optLo; j <= min(mid-1, optHi); j++ {
			if prev[j] >= inf {
				continue
			}
			if c := w(j, mid); c < inf && prev[j]+c < best {
				best, bestJ = prev[j]+c, j
			}
		}
		cur[mid], arg[g][mid] = best, int32(bestJ)
		solve(g, lo, mid-1, optLo, bestJ)
		solve(g, mid+1, hi, bestJ, optHi)
	}
	for g := 1; g <= k; g++ {
		arg[g] = make([]int32, n+1)
		for i := range cur {
			cur[i] = inf
		}
		solve(g, g, n-(k-g), g-1, n-1)
		prev, cur = cur, prev
	}
	if prev[n] >= inf {
		return nil
	}
	cuts := make([]int, k+1)
	cuts[k] = n
	for g := k; g >= 1; g-- {
		cuts[g-1] = int(arg[g][cuts[g]])
	}
	if !slices.IsSorted(cuts) {
		return nil
	}
	return cuts
}
