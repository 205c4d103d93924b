package balancer

import (
	"cmp"
	"math"
	"slices"
)

// bestCandidate is the pipeline's pick: of cur (the grouping candidate) and
// the alternatives — balance-first (LPT by unpadded cost, then each rank cut
// into micro-batches of least padded cost; below balanceFirstLimit items),
// the random baseline's split of the same items (not in positionsFirst's
// sub-partitioners, whose plans are only candidates of their caller's) and
// positionsFirst under SyncMicroBatch, the most promising refined when the
// batch is small — it returns the one of least score (step cost, then
// total); ties keep cur. Every candidate
// holds the budget and gives every rank MicroBatches non-empty micro-batches.
func (jb *job) bestCandidate(sc *padScratch, cur Assignment, alt alternatives) Assignment {
	var cands [][][]int32
	for _, c := range [][][]int32{alt.balance, jb.randomSplitUnlessSub(), alt.lengthPos, alt.costPos} {
		if c != nil {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return cur
	}
	best := cur
	bestMax, bestSum := jb.score(sc, cur.Members)
	// Refine, on small batches, the more promising alternative too, unless
	// cur is already within refineAltImbalance of even (then an alternative
	// only wins as is) or it is more than refineMargin behind.
	refine := jb.cfg.Refinement == RefineLocalSearch && len(jb.items) <= refineCandidatesLimit &&
		bestMax > (1+refineAltImbalance)*bestSum/float64(jb.cfg.DP)
	var alts [][][]int32
	var his []float64
	for _, alt := range cands {
		hi, sum := jb.score(sc, alt)
		if hi < bestMax*(1-minGain) || (hi <= bestMax && sum < bestSum*(1-minGain)) {
			best, bestMax, bestSum = jb.assignment(sc), hi, sum
		}
		alts, his = append(alts, alt), append(his, hi)
	}
	if !refine || len(alts) == 0 {
		return best
	}
	k := 0
	for i := range his {
		if his[i] < his[k] {
			k = i
		}
	}
	if his[k] >= bestMax*(1+refineMargin) {
		return best
	}
	jb.load(sc, alts[k])
	jb.padSearch(sc)
	if hi, sum := jb.stepScore(sc); hi < bestMax*(1-minGain) || (hi <= bestMax && sum < bestSum*(1-minGain)) {
		best = jb.assignment(sc)
	}
	return best
}

// score loads members and returns the maximum and the sum of the padded
// rank step costs.
func (jb *job) score(sc *padScratch, members [][]int32) (float64, float64) {
	jb.load(sc, members)
	return jb.stepScore(sc)
}

// stepScore returns the step cost the partitioner minimises (the largest
// rank cost, or with SyncMicroBatch syncedCost when larger) and the sum of
// the rank costs.
func (jb *job) stepScore(sc *padScratch) (hi, sum float64) {
	for _, c := range sc.step {
		hi, sum = max(hi, c), sum+c
	}
	if jb.cfg.Sync == SyncMicroBatch && jb.cfg.MicroBatches > 1 {
		hi = max(hi, jb.syncedCost(sc))
	}
	return hi, sum
}

// syncedCost returns the step cost when the ranks meet at every micro-batch
// and each rank runs its micro-batches costliest first (as assignment orders
// them): Σ over positions j of the largest j-th costliest micro-batch.
func (jb *job) syncedCost(sc *padScratch) float64 {
	m, pl := jb.cfg.MicroBatches, jb.cfg.Placement
	sc.slotMax = slices.Grow(sc.slotMax[:0], 2*m)[:2*m]
	top, buf := sc.slotMax[:m], sc.slotMax[m:]
	clear(top)
	for r := range jb.cfg.DP {
		for j := range m {
			buf[j] = pl.StepCost(sc.groups[r*m+j].cost)
		}
		slices.Sort(buf)
		for j := range m {
			top[j] = max(top[j], buf[m-1-j])
		}
	}
	var s float64
	for _, c := range top {
		s += c
	}
	return s
}

// load makes members (slot r*M+m) the current groups and computes the ranks'
// padded costs.
func (jb *job) load(sc *padScratch, members [][]int32) {
	dp := jb.cfg.DP
	k := len(members)
	sc.groups = slices.Grow(sc.groups[:0], k)[:k]
	for g := range k {
		sc.groups[g].members = append(sc.groups[g].members[:0], members[g]...)
		sc.groups[g].contiguousID = int32(g)
		jb.refresh(sc, g)
	}
	sc.rank = slices.Grow(sc.rank[:0], dp)[:dp]
	sc.step = slices.Grow(sc.step[:0], dp)[:dp]
	for r := range dp {
		jb.rankCost(sc, r)
	}
}

// randomSplitUnlessSub is randomSplit, or nil in positionsFirst's
// sub-partitioners (their plans are only candidates of their caller's,
// which weighs the random split itself).
func (jb *job) randomSplitUnlessSub() [][]int32 {
	if jb.sub {
		return nil
	}
	return jb.randomSplit()
}

// randomSplit is the random baseline's split of the items in their given
// order: rank r takes positions r, r+DP, …, cut into consecutive micro-batches
// of sizes differing by at most one. Nil when it breaks the budget.
func (jb *job) randomSplit() [][]int32 {
	dp, m := jb.cfg.DP, jb.cfg.MicroBatches
	out := make([][]int32, dp*m)
	for r := range dp {
		var rank []int32
		for k := r; k < len(jb.items); k += dp {
			rank = append(rank, int32(k))
		}
		for j, sz := 0, 0; j < m; j, rank = j+1, rank[sz:] {
			sz = chunk(len(rank), m-j, 0)
			out[r*m+j] = rank[:sz:sz]
		}
	}
	if !jb.fits(out) {
		return nil
	}
	return out
}

// fits reports whether every micro-batch is non-empty and within budget.
func (jb *job) fits(members [][]int32) bool {
	for _, mb := range members {
		var s mbShape
		for _, pos := range mb {
			s.add(jb.items[pos])
		}
		if s.count == 0 || !jb.cfg.Budget.Fits(s.count, s.maxL, s.sumP) {
			return false
		}
	}
	return true
}

// balanceFirst deals the items, costliest (unpadded) first, to the rank whose
// step cost grows least, keeping enough items back that every rank gets
// MicroBatches; then cuts every rank into micro-batches (rankCuts). Nil when
// the budget cannot hold a rank's cut.
func (jb *job) balanceFirst() [][]int32 {
	dp, m := jb.cfg.DP, jb.cfg.MicroBatches
	pl := jb.cfg.Placement
	n := len(jb.items)
	type keyed struct {
		cost float64
		pos  int32
	}
	idx := make([]keyed, n)
	for i := range idx {
		idx[i] = keyed{pl.StepCost(jb.costs[i]), int32(i)}
	}
	slices.SortFunc(idx, func(x, y keyed) int {
		if x.cost != y.cost {
			return cmp.Compare(y.cost, x.cost)
		}
		return cmp.Compare(x.pos, y.pos)
	})
	load := make([]Cost, dp)
	ranks := make([][]int32, dp)
	deficit := dp * m
	var least rankHeap // colocated: the ranks by (load, rank)
	if pl == Colocated {
		least = newRankHeap(dp)
	}
	for k, kp := range idx {
		pos := kp.pos
		left := n - k - 1                    // items after this one
		if least != nil && deficit <= left { // any rank may take it: the least loaded
			r := least.top()
			if len(ranks[r]) < m {
				deficit--
			}
			ranks[r] = append(ranks[r], pos)
			load[r].Vision += kp.cost
			least.raise(kp.cost)
			continue
		}
		best, bestC := -1, 0.0
		for r := range dp {
			if len(ranks[r]) >= m && deficit > left {
				continue // the rest must fill the ranks still short of m
			}
			var c float64
			if pl == Colocated { // the step grows least on the least loaded rank
				c = load[r].Vision
			} else {
				c = pl.StepCost(load[r].Add(jb.costs[pos]))
			}
			if best < 0 || c < bestC {
				best, bestC = r, c
			}
		}
		if len(ranks[best]) < m {
			deficit--
		}
		ranks[best] = append(ranks[best], pos)
		if pl == Colocated {
			load[best].Vision += kp.cost
			least.set(best, load[best].Vision)
		} else {
			load[best] = load[best].Add(jb.costs[pos])
		}
	}
	out := make([][]int32, dp*m)
	vary := jb.imagesVary()
	for r, rank := range ranks {
		cut := jb.rankCuts(rank, vary)
		if cut == nil {
			return nil
		}
		copy(out[r*m:(r+1)*m], cut)
	}
	return out
}

// rankCuts sorts one rank's items by (L, P) and by (P, L) and cuts each order
// into MicroBatches contiguous budget-feasible micro-batches of least summed
// padded cost (exact program for up to rankCutLimit items, equal counts
// above); it returns the better. Nil when neither order has a feasible cut.
func (jb *job) rankCuts(rank []int32, vary bool) [][]int32 {
	type keyed struct {
		key uint64 // major << 21 | minor (tokens are at most MaxItemTokens = 2²⁰)
		pos int32
	}
	ks := make([]keyed, len(rank))
	s := make([]int32, len(rank))
	var best [][]int32
	bestC := math.Inf(1)
	for o := range 2 {
		if o == 1 && !vary {
			break // with one P the two orders agree
		}
		for i, pos := range rank {
			it := jb.items[pos]
			major, minor := it.TextTokens, it.ImageTokens
			if o == 1 {
				major, minor = minor, major
			}
			ks[i] = keyed{uint64(major)<<21 | uint64(minor), pos}
		}
		slices.SortFunc(ks, func(x, y keyed) int {
			if x.key != y.key {
				return cmp.Compare(x.key, y.key)
			}
			return cmp.Compare(x.pos, y.pos)
		})
		for i, k := range ks {
			s[i] = k.pos
		}
		cut, c := jb.cutRank(s)
		if cut != nil && c < bestC {
			best, bestC = cut, c
			s = make([]int32, len(rank)) // best holds subslices of s
		}
	}
	return best
}

// cutRank cuts the sorted items s into MicroBatches contiguous micro-batches
// minimising Σ padded cost (Total), and returns them with that sum.
func (jb *job) cutRank(s []int32) ([][]int32, float64) {
	m, n := jb.cfg.MicroBatches, len(s)
	if n > rankCutLimit {
		out := make([][]int32, m)
		var sum float64
		for j, rest := 0, s; j < m; j++ {
			sz := chunk(n, m, j)
			out[j], rest = rest[:sz:sz], rest[sz:]
			var sh mbShape
			for _, pos := range out[j] {
				sh.add(jb.items[pos])
			}
			if !jb.cfg.Budget.Fits(sh.count, sh.maxL, sh.sumP) {
				return nil, 0
			}
			sum += jb.total.Dot(sh.features())
		}
		return out, sum
	}
	inf := math.Inf(1)
	prev := make([]float64, n+1)
	cur := make([]float64, n+1)
	arg := make([]int32, (m+1)*(n+1))
	for i := range prev {
		prev[i] = inf
	}
	prev[0] = 0
	for g := 1; g <= m; g++ {
		for i := range cur {
			cur[i] = inf
		}
		lo := g
		if g == m {
			lo = n // the last micro-batch ends at n
		}
		for i := lo; i <= n-(m-g); i++ {
			var sh mbShape
			for j := i - 1; j >= g-1; j-- {
				sh.add(jb.items[s[j]])
				if !jb.cfg.Budget.Fits(sh.count, sh.maxL, sh.sumP) {
					break // longer micro-batches only grow
				}
				if math.IsInf(prev[j], 1) {
					continue
				}
				if v := prev[j] + jb.total.Dot(sh.features()); v < cur[i] {
					cur[i], arg[g*(n+1)+i] = v, int32(j)
				}
			}
		}
		prev, cur = cur, prev
	}
	if math.IsInf(prev[n], 1) {
		return nil, 0
	}
	out := make([][]int32, m)
	end := n
	for g := m; g >= 1; g-- {
		start := int(arg[g*(n+1)+end])
		out[g-1] = s[start:end:end]
		end = start
	}
	return out, prev[n]
}
