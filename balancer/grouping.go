package balancer

import (
	"math"
	"slices"
)

// dpGroupingLimit bounds K·n for the exact grouping by dynamic programming;
// larger batches are dense enough in length that equal-cost cuts already pad
// little and balance well.
const dpGroupingLimit = 1 << 17

// lambdaSteps is the number of bisection steps of the balance weight λ.
const lambdaSteps = 10

// initialSlack is the share of the padding slack (between the padding-optimal
// grouping and the padding target) the initial grouping may spend on equal
// group costs; the rest is left to the refinement.
const initialSlack = 0.5

// cutter holds what the grouping programs need of the length-sorted order.
type cutter struct {
	l   []int64   // L of order[i]
	ps  []int     // prefix Σ P
	cs  []float64 // prefix Σ cost
	bud Budget
}

func (p *Partitioner) newCutter() cutter {
	n := len(p.order)
	c := cutter{l: make([]int64, n), ps: make([]int, n+1), cs: make([]float64, n+1), bud: p.cfg.Budget}
	for i, pos := range p.order {
		c.l[i] = int64(p.items[pos].TextTokens)
		c.ps[i+1] = c.ps[i] + p.items[pos].ImageTokens
		c.cs[i+1] = c.cs[i] + p.costs[pos].Total()
	}
	return c
}

// padded returns Σ count × longest L of the groups cut at cuts.
func (c cutter) padded(cuts []int) int64 {
	var s int64
	for g := 1; g < len(cuts); g++ {
		s += int64(cuts[g]-cuts[g-1]) * c.l[cuts[g]-1]
	}
	return s
}

// balancedCuts cuts the length-sorted order into k groups, trading padding for
// equal group costs (equal group costs make the assignment of k = DP × M groups
// to ranks, M each, balanced by construction). It first finds the
// padding-optimal grouping; when that leaves slack below the padding cap real /
// PaddingTarget, it bisects the weight λ of the cost-deviation term for the
// most balanced grouping that spends at most initialSlack of the slack. It
// returns nil when the budget leaves no feasible grouping.
func (p *Partitioner) balancedCuts(k int) []int {
	c := p.newCutter()
	best := c.cuts(k, 0, 0)
	if best == nil {
		return nil
	}
	var real int64
	for _, l := range c.l {
		real += l
	}
	optPad := c.padded(best)
	limit := float64(real) / p.cfg.PaddingTarget
	allowed := int64(float64(optPad) + initialSlack*(limit-float64(optPad)))
	if allowed <= optPad {
		return best
	}
	unit := float64(optPad) / float64(k) // one average group's padded tokens
	lo, hi := -8.0, 12.0                 // log2 λ
	for range lambdaSteps {
		mid := (lo + hi) / 2
		cuts := c.cuts(k, math.Exp2(mid)*unit, c.cs[len(c.l)]/float64(k))
		if cuts != nil && c.padded(cuts) <= allowed {
			best, lo = cuts, mid
		} else {
			hi = mid
		}
	}
	return best
}

// cuts returns the k+1 cut positions of the contiguous budget-feasible
// grouping minimising Σ_g count_g × longest L_g + w · ((C_g − t) / t)², where
// C_g is the group's cost, by dynamic programming with the divide-and-conquer
// optimisation: both terms satisfy the quadrangle inequality (the first on
// sorted lengths, the second as a convex function of a contiguous sum), so
// optimal split points are monotone. w = 0 gives the padding-optimal grouping.
// It returns nil when the budget leaves no feasible grouping.
func (c cutter) cuts(k int, w, t float64) []int {
	n := len(c.l)
	inf := math.Inf(1)
	cost := func(j, i int) float64 { // group order[j:i], i > j
		if !c.bud.Fits(i-j, int(c.l[i-1]), c.ps[i]-c.ps[j]) {
			return inf
		}
		v := float64(int64(i-j) * c.l[i-1])
		if w > 0 {
			d := (c.cs[i] - c.cs[j] - t) / t
			v += w * d * d
		}
		return v
	}
	prev := make([]float64, n+1)
	cur := make([]float64, n+1)
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
			if math.IsInf(prev[j], 1) {
				continue
			}
			if v := prev[j] + cost(j, mid); v < best {
				best, bestJ = v, j
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
	if math.IsInf(prev[n], 1) {
		return nil
	}
	cuts := make([]int, k+1)
	cuts[k] = n
	for g := k; g >= 1; g-- {
		cuts[g-1] = int(arg[g][cuts[g]])
	}
	if !validCuts(cuts, n) || !slices.IsSorted(cuts) {
		return nil
	}
	return cuts
}
