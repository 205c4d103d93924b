package balancer

import (
	"math"
	"slices"
)

// cutter holds what the grouping programs need of the length-sorted order.
type cutter struct {
	l   []int64   // L of order[i]
	ps  []int     // prefix Σ P
	cs  []float64 // prefix Σ cost
	bud Budget
	dp  dpState
}

func (jb *job) newCutter(order []int32) *cutter {
	n := len(order)
	c := &cutter{l: make([]int64, n), ps: make([]int, n+1), cs: make([]float64, n+1), bud: jb.cfg.Budget}
	for i, pos := range order {
		c.l[i] = int64(jb.items[pos].TextTokens)
		c.ps[i+1] = c.ps[i] + jb.items[pos].ImageTokens
		c.cs[i+1] = c.cs[i] + jb.costs[pos].Total()
	}
	return c
}

// padded returns Σ count × longest L of the groups cut at cuts.
func (c *cutter) padded(cuts []int) int64 {
	var s int64
	for g := 1; g < len(cuts); g++ {
		s += int64(cuts[g]-cuts[g-1]) * c.l[cuts[g]-1]
	}
	return s
}

// balancedCuts cuts order (length-sorted) into k groups, trading padding for
// equal group costs (equal group costs make the assignment of k = DP × M groups
// to ranks, M each, balanced by construction). It first finds the
// padding-optimal grouping; when that leaves slack below the padding cap real /
// PaddingTarget, it bisects the weight λ of the cost-deviation term for the
// most balanced grouping that spends at most initialSlack of the slack
// (stopping early once within closeEnough of it). It returns opt, the
// padding-optimal cuts, when there is no slack or no λ fits.
func (jb *job) balancedCuts(order []int32, k int, opt []int) []int {
	c := jb.newCutter(order)
	best := opt
	var real int64
	for _, l := range c.l {
		real += l
	}
	optPad := c.padded(best)
	limit := float64(real) / jb.cfg.PaddingTarget
	allowed := int64(float64(optPad) + initialSlack*(limit-float64(optPad)))
	if allowed <= optPad {
		return best
	}
	unit := float64(optPad) / float64(k) // one average group's padded tokens
	lo, hi := lambdaLog2Min, lambdaLog2Max
	for range lambdaSteps {
		mid := (lo + hi) / 2
		cuts := c.cuts(k, math.Exp2(mid)*unit, c.cs[len(c.l)]/float64(k))
		if cuts != nil && c.padded(cuts) <= allowed {
			best, lo = cuts, mid
			if float64(allowed-c.padded(cuts)) <= closeEnough*float64(allowed-optPad) {
				break // spends nearly all the slack it may
			}
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
func (c *cutter) cuts(k int, w, t float64) []int {
	n := len(c.l)
	s := &c.dp
	s.c, s.w, s.t, s.limited = c, w, t, !c.bud.Unlimited()
	s.prev = slices.Grow(s.prev[:0], n+1)[:n+1]
	s.cur = slices.Grow(s.cur[:0], n+1)[:n+1]
	s.arg = slices.Grow(s.arg[:0], (k+1)*(n+1))[:(k+1)*(n+1)]
	s.n = n
	inf := math.Inf(1)
	for i := range s.prev {
		s.prev[i] = inf
	}
	s.prev[0] = 0
	for g := 1; g <= k; g++ {
		for i := range s.cur {
			s.cur[i] = inf
		}
		s.solve(g, g, n-(k-g), g-1, n-1)
		s.prev, s.cur = s.cur, s.prev
	}
	if math.IsInf(s.prev[n], 1) {
		return nil
	}
	cuts := make([]int, k+1)
	cuts[k] = n
	for g := k; g >= 1; g-- {
		cuts[g-1] = int(s.arg[g*(n+1)+cuts[g]])
	}
	if !validCuts(cuts, n) {
		return nil
	}
	return cuts
}

// dpState is the scratch space of cutter.cuts.
type dpState struct {
	c         *cutter
	w, t      float64
	limited   bool
	n         int
	prev, cur []float64
	arg       []int32 // arg[g*(n+1)+i]: best start of the last of g groups ending at i
}

// weight is the cost of the group order[j:i], i > j.
func (s *dpState) weight(j, i int) float64 {
	c := s.c
	l := c.l[i-1]
	if s.limited && !c.bud.Fits(i-j, int(l), c.ps[i]-c.ps[j]) {
		return math.Inf(1)
	}
	v := float64(int64(i-j) * l)
	if s.w > 0 {
		d := (c.cs[i] - c.cs[j] - s.t) / s.t
		v += s.w * d * d
	}
	return v
}

// solve fills cur[lo..hi] for g groups, knowing the optimal split of the
// midpoints lies in [optLo, optHi].
func (s *dpState) solve(g, lo, hi, optLo, optHi int) {
	for lo <= hi {
		mid := (lo + hi) / 2
		best, bestJ := math.Inf(1), optLo
		for j := optLo; j <= min(mid-1, optHi); j++ {
			if v := s.prev[j] + s.weight(j, mid); v < best {
				best, bestJ = v, j
			}
		}
		s.cur[mid], s.arg[g*(s.n+1)+mid] = best, int32(bestJ)
		s.solve(g, lo, mid-1, optLo, bestJ)
		lo, optLo = mid+1, bestJ // tail call on the right half
	}
}
