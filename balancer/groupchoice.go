package balancer

import (
	"math"
	"slices"
)

// grouping is a sorted order of the positions and its cut into DP × M
// contiguous groups.
type grouping struct {
	order    []int32
	cuts     []int
	byLength bool // order is the length-sorted one (balancedCuts may retry)
	// loaded: chooseGrouping left this grouping's groups, dealt to the
	// ranks, in its scratch (groupedCandidate need not build them again).
	loaded bool
}

// chooseGrouping returns, of the length-sorted order cut at lengthCuts, the
// same order cut into groups of least maximum padded cost (minMaxCuts), and,
// when the image tokens vary, the image-sorted order cut that way, the one
// whose groups, dealt to the ranks (assignGroups), give the least maximum
// padded rank cost before refinement; ties keep the earlier. Under dynamic
// resolution P usually dominates the padding, so the image-sorted groups win.
// byLength is the length-sorted order (sortByLength). The candidates are
// scored in sc.
func (jb *job) chooseGrouping(sc *padScratch, byLength []int32, lengthCuts []int) grouping {
	k := jb.cfg.DP * jb.cfg.MicroBatches
	cands := []grouping{{order: byLength, cuts: lengthCuts, byLength: true}}
	vary := jb.imagesVary()
	if !vary || k*len(jb.items) <= jb.dpLimit {
		if c := jb.minMaxCuts(byLength, k); c != nil && !slices.Equal(c, lengthCuts) {
			cands = append(cands, grouping{order: byLength, cuts: c})
		}
	}
	if vary {
		byImage := jb.sortByImage()
		if c := jb.minMaxCuts(byImage, k); c != nil {
			cands = append(cands, grouping{order: byImage, cuts: c})
		}
	}
	if len(cands) == 1 {
		return cands[0]
	}
	best, bestHi := 0, math.Inf(1)
	for i, g := range cands {
		jb.buildGroups(sc, g.order, g.cuts)
		jb.assignGroups(sc)
		if hi, _ := jb.stepScore(sc); hi < bestHi*(1-minGain) {
			best, bestHi = i, hi
		}
	}
	cands[best].loaded = best == len(cands)-1
	return cands[best]
}

// buildGroups makes sc's groups the runs of order between cuts.
func (jb *job) buildGroups(sc *padScratch, order []int32, cuts []int) {
	k := len(cuts) - 1
	sc.groups = slices.Grow(sc.groups[:0], k)[:k]
	for g := range k {
		gr := &sc.groups[g]
		gr.members = append(gr.members[:0], order[cuts[g]:cuts[g+1]]...)
		gr.contiguousID = int32(g)
	}
}

// imagesVary reports whether the items' image tokens differ.
func (jb *job) imagesVary() bool {
	for _, it := range jb.items {
		if it.ImageTokens != jb.items[0].ImageTokens {
			return true
		}
	}
	return false
}

// sortByImage returns the positions sorted by (P, L, cost, position).
func (jb *job) sortByImage() []int32 {
	if out := jb.ranked.sorted(jb.items, imageField, textField); out != nil {
		return out
	}
	return jb.sortBy(func(it Item) (int, int) { return it.ImageTokens, it.TextTokens })
}

// minMaxCuts cuts order into k contiguous budget-feasible groups whose
// largest padded cost (total) is about least: it bisects the threshold T of
// a greedy left-to-right packing (groups grow while their padded cost stays
// within T; a longer run never costs less), then splits the largest groups
// until there are k. Nil when the budget leaves no packing in k groups.
func (jb *job) minMaxCuts(order []int32, k int) []int {
	n := len(order)
	run := cutRun{items: make([]runItem, n)} // the items in order, without the indirection
	var lo, sum float64
	var all mbShape
	for i, pos := range order {
		it := &jb.items[pos]
		run.items[i] = runItem{it.TextTokens, it.ImageTokens, it.Complexity}
		var s mbShape
		s.add(*it)
		all.add(*it)
		c := jb.fastTotal(s)
		lo, sum = max(lo, c), sum+c
	}
	if jb.growingCost {
		run.blocks = cutBlocks(run.items)
	}
	lo = max(lo, sum/float64(k))      // no group of k does better
	top := max(jb.fastTotal(all), lo) // no contiguous group costs more
	buf := make([]int, 0, k+1)
	cuts := jb.greedyCuts(run, math.Inf(1), k, nil)
	if cuts == nil {
		return nil
	}
	hi := top
	for t := 2 * lo; t < top; t *= 2 { // gallop: the optimum is usually a few times lo
		if c := jb.greedyCuts(run, t, k, buf); c != nil {
			cuts, hi = append(cuts[:0], c...), t
			break
		}
		lo = t
	}
	for range minMaxSteps {
		mid := (lo + hi) / 2
		if c := jb.greedyCuts(run, mid, k, buf); c != nil {
			cuts, hi = append(cuts[:0], c...), mid
		} else {
			lo = mid
		}
		if hi-lo <= minMaxTolerance*hi {
			break
		}
	}
	for len(cuts)-1 < k { // split the group with the most members in half
		best := 1
		for g := 2; g < len(cuts); g++ {
			if cuts[g]-cuts[g-1] > cuts[best]-cuts[best-1] {
				best = g
			}
		}
		mid := (cuts[best-1] + cuts[best]) / 2
		cuts = slices.Insert(cuts, best, mid)
	}
	if !validCuts(cuts, n) {
		return nil
	}
	return cuts
}

// cutRun is what greedyCuts reads of the order being cut, packed for the
// bisection's passes over it: its items (without ID), and, when a group's
// cost cannot fall as it grows (jb.growingCost), their summaries by blocks
// of cutStride (stridedCuts).
type cutRun struct {
	items  []runItem
	blocks []cutBlock
}

// runItem is what greedyCuts reads of an item.
type runItem struct {
	TextTokens, ImageTokens int
	Complexity              float64
}

// cutBlock summarises items[b·cutStride : (b+1)·cutStride] of a cutRun:
// their longest L, largest P and Σ P.
type cutBlock struct{ maxL, maxP, sumP int }

// cutBlocks returns the summaries of items by blocks of cutStride (token
// counts are not negative: jb.growingCost).
func cutBlocks(items []runItem) []cutBlock {
	out := make([]cutBlock, (len(items)+cutStride-1)/cutStride)
	for i, it := range items {
		b := &out[i/cutStride]
		b.maxL, b.maxP, b.sumP = max(b.maxL, it.TextTokens), max(b.maxP, it.ImageTokens), b.sumP+it.ImageTokens
	}
	return out
}

// greedyCuts packs run (the items in the order being cut) left to right into
// groups of padded cost at most t within the budget, appending the cuts to
// buf[:0]; nil when an item alone exceeds t or more than k groups are needed.
// When a group's cost cannot fall as it grows (run.blocks) the groups are
// found by blocks (stridedCuts), the same cuts.
func (jb *job) greedyCuts(run cutRun, t float64, k int, buf []int) []int {
	if run.blocks != nil {
		return jb.stridedCuts(run, t, k, buf)
	}
	cuts := append(buf[:0], 0)
	c := &jb.total
	limited := !jb.cfg.Budget.Unlimited()
	count, maxL, maxP, sumP, cplx := 0, 0, 0, 0, 0.0
	for i, it := range run.items {
		nl, np := max(maxL, it.TextTokens), max(maxP, it.ImageTokens)
		l, q := float64(nl), float64(np)
		per := float64(c[FeatL]*l) + float64(c[FeatL2]*(l*l)) + float64(c[FeatP]*q) + float64(c[FeatP2]*(q*q)) +
			float64(c[FeatLP]*(l*q)) + c[FeatOne]
		cost := float64(count+1)*per + float64(c[FeatComplexity]*(cplx+it.Complexity))
		if count > 0 && (cost > t || limited && !jb.cfg.Budget.Fits(count+1, nl, sumP+it.ImageTokens)) {
			if len(cuts) == k {
				return nil
			}
			cuts = append(cuts, i)
			count, maxL, maxP, sumP, cplx = 0, 0, 0, 0, 0
			var s mbShape
			s.add(Item{TextTokens: it.TextTokens, ImageTokens: it.ImageTokens, Complexity: it.Complexity})
			if jb.fastTotal(s) > t {
				return nil
			}
			nl, np = it.TextTokens, it.ImageTokens
		} else if cost > t {
			return nil
		}
		count++
		maxL, maxP, sumP, cplx = nl, np, sumP+it.ImageTokens, cplx+it.Complexity
	}
	return append(cuts, len(run.items))
}

// stridedCuts is greedyCuts when a group's padded cost is its count times
// perSample at its longest L and largest P, which cannot fall as it grows
// (non-negative coefficients and token counts), and neither can its budget
// fields. A group then takes a whole block of run.blocks (or the rest of
// the block it is in) when it can take the block's last item, so only that
// one is priced, from the block's summary; where it cannot, the block is
// priced item by item as greedyCuts does. Same cuts; a group of g samples
// is priced about g / cutStride + cutStride / 2 times, not g.
func (jb *job) stridedCuts(run cutRun, t float64, k int, buf []int) []int {
	c := &jb.total
	bud := jb.cfg.Budget
	limited := !bud.Unlimited()
	// fits reports whether a group of count samples, longest L l, largest P
	// p and image tokens sumP costs at most t within the budget.
	fits := func(count, l, p, sumP int) bool {
		return !(float64(count)*perSample(c, l, p) > t) && (!limited || bud.Fits(count, l, sumP))
	}
	items, n := run.items, len(run.items)
	cuts := append(buf[:0], 0)
	for s := 0; ; {
		first := items[s]
		if perSample(c, first.TextTokens, first.ImageTokens) > t {
			return nil // one sample alone exceeds t
		}
		maxL, maxP, sumP := first.TextTokens, first.ImageTokens, first.ImageTokens
		f := s + 1 // the first sample the group cannot take, once found
		for f < n {
			end := min((f/cutStride+1)*cutStride, n) // the end of f's block
			l, p, sp := maxL, maxP, sumP
			if f%cutStride == 0 {
				b := run.blocks[f/cutStride]
				l, p, sp = max(l, b.maxL), max(p, b.maxP), sp+b.sumP
			} else {
				for i := f; i < end; i++ {
					l, p, sp = max(l, items[i].TextTokens), max(p, items[i].ImageTokens), sp+items[i].ImageTokens
				}
			}
			if fits(end-s, l, p, sp) {
				f, maxL, maxP, sumP = end, l, p, sp
				continue
			}
			for ; f < end; f++ {
				it := items[f]
				l, p, sp := max(maxL, it.TextTokens), max(maxP, it.ImageTokens), sumP+it.ImageTokens
				if !fits(f-s+1, l, p, sp) {
					break
				}
				maxL, maxP, sumP = l, p, sp
			}
			break
		}
		if f == n {
			return append(cuts, n)
		}
		if len(cuts) == k {
			return nil
		}
		cuts = append(cuts, f)
		s = f
	}
}

// perSample returns the padded cost of one sample in a micro-batch of
// longest L l and largest P q: fastDot's per-entry term.
func perSample(c *Features, nl, np int) float64 {
	l, q := float64(nl), float64(np)
	return float64(c[FeatL]*l) + float64(c[FeatL2]*(l*l)) + float64(c[FeatP]*q) + float64(c[FeatP2]*(q*q)) +
		float64(c[FeatLP]*(l*q)) + c[FeatOne]
}

// fastTotal returns p.total.Dot(s.features()) without building the vector
// (the bisection's inner loop). The products are rounded one by one like
// Features.Dot, so the two agree to the last bit up to summation order.
func (p *Partitioner) fastTotal(s mbShape) float64 { return fastDot(&p.total, s) }

// fastDot returns c.Dot(s.features()) without building the vector.
func fastDot(c *Features, s mbShape) float64 {
	n, l, q := float64(s.count), float64(s.maxL), float64(s.maxP)
	per := float64(c[FeatL]*l) + float64(c[FeatL2]*(l*l)) + float64(c[FeatP]*q) + float64(c[FeatP2]*(q*q)) +
		float64(c[FeatLP]*(l*q)) + c[FeatOne]
	return n*per + float64(c[FeatComplexity]*s.complexity)
}
