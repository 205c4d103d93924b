package balancer

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// The packed partitioner (Config.Pack). A packed micro-batch costs the sum of
// its samples' own costs plus a constant (PackedFeatures), so balancing is a
// problem of equal sums and can be solved almost exactly. It is an explicit
// pipeline:
//
//  1. candidate generators (packLevels, packLPT) each return an assignment
//     of the step's positions to DP × MicroBatches bins (slot r*M+m);
//  2. one scoring function (packScore) gives the step cost under Sync, the
//     candidate with the lowest score is kept;
//  3. refinement passes (refinePositions, refineAcross) improve it in place,
//     with all their state in an explicit packScratch.
//
// The tuning constants are in tuning.go.

// packScratch is the refinement's state: the bins, their cost and budget
// sums, and the step layout.
type packScratch struct {
	dp, m  int
	pl     Placement
	sync   Sync
	budget Budget
	items  []Item
	costs  []Cost
	bins   [][]int32 // bins[r*m+j]: rank r's micro-batch at position j
	load   []Cost
	sumL   []int
	sumP   []int
	ic     []float64 // ic[pos]: item pos's step cost
	binC   []float64 // binC[b]: bin b's step cost, kept with load
	// sorted[b] holds bin b's member indexes sorted by their step cost and
	// sortedC[b] those costs; valid while fresh[b] (add and apply clear it).
	sorted  [][]int
	sortedC [][]float64
	fresh   []bool
}

// newPackScratch returns a scratch of bins (taken over, not copied) with
// their sums computed.
func (jb *job) newPackScratch(bins [][]int32) *packScratch {
	s := &packScratch{
		dp: jb.cfg.DP, m: jb.cfg.MicroBatches, pl: jb.cfg.Placement, sync: jb.cfg.Sync, budget: jb.cfg.Budget,
		items: jb.items, costs: jb.costs, bins: bins, ic: jb.stepCost,
		load: make([]Cost, len(bins)), sumL: make([]int, len(bins)), sumP: make([]int, len(bins)),
		binC: make([]float64, len(bins)), sorted: make([][]int, len(bins)), sortedC: make([][]float64, len(bins)),
		fresh: make([]bool, len(bins)),
	}
	for b := range bins {
		s.recount(b)
	}
	return s
}

func (s *packScratch) recount(b int) {
	s.load[b], s.sumL[b], s.sumP[b] = Cost{}, 0, 0
	for _, pos := range s.bins[b] {
		s.load[b] = s.load[b].Add(s.costs[pos])
		s.sumL[b] += s.items[pos].TextTokens
		s.sumP[b] += s.items[pos].ImageTokens
	}
	s.binC[b], s.fresh[b] = s.pl.StepCost(s.load[b]), false
}

// cost is the step cost of bin b's micro-batch (without the overhead, which
// every bin pays alike).
func (s *packScratch) cost(b int) float64 { return s.binC[b] }

// fits reports whether bin b stays within the budget and non-empty with
// count entries, dl text and dp image tokens added.
func (s *packScratch) fits(b, count, dl, dp int) bool {
	n := len(s.bins[b]) + count
	return n >= 1 && s.budget.FitsPacked(n, s.sumL[b]+dl, s.sumP[b]+dp)
}

// packScore is the one scoring function: the step cost of bins under Sync
// (Σ over positions of the costliest bin there, or the costliest rank
// total), without the overhead.
func (s *packScratch) packScore() float64 {
	if s.sync == SyncMicroBatch { // Σ of position maxima ≥ every rank's total
		var sum float64
		for j := range s.m {
			sum += s.positionMax(j)
		}
		return sum
	}
	return s.rankMax()
}

func (s *packScratch) positionMax(j int) float64 {
	var hi float64
	for r := range s.dp {
		hi = max(hi, s.cost(r*s.m+j))
	}
	return hi
}

func (s *packScratch) rankMax() float64 {
	var hi float64
	for r := range s.dp {
		var c Cost
		for j := range s.m {
			c = c.Add(s.load[r*s.m+j])
		}
		hi = max(hi, s.pl.StepCost(c))
	}
	return hi
}

// partitionPacked is Partition under Config.Pack.
func (jb *job) partitionPacked() (Assignment, error) {
	k := jb.cfg.DP * jb.cfg.MicroBatches
	var sumL, sumP int
	for _, it := range jb.items {
		sumL += it.TextTokens
		sumP += it.ImageTokens
	}
	if b := jb.cfg.Budget; b.MaxTokens > 0 && sumL+sumP > k*b.MaxTokens {
		return Assignment{}, fmt.Errorf("balancer: %d tokens do not fit in %d packed micro-batches of %d: %w",
			sumL+sumP, k, b.MaxTokens, ErrBudgetExceeded)
	}
	order := jb.packOrder()
	var best *packScratch
	bestScore := 0.0
	for _, gen := range []func([]int32) [][]int32{jb.packLevels, jb.packLPT} {
		bins := gen(order)
		if bins == nil {
			continue
		}
		s := jb.newPackScratch(bins)
		if jb.cfg.Refinement == RefineLocalSearch {
			s.refinePositions()
			s.refineAcross()
		}
		if sc := s.packScore(); best == nil || sc < bestScore*(1-packMinGain) {
			best, bestScore = s, sc
		}
	}
	if best == nil {
		return Assignment{}, fmt.Errorf("balancer: %d items do not fit in %d packed micro-batches under budget %+v: %w",
			len(jb.items), k, jb.cfg.Budget, ErrBudgetExceeded)
	}
	return best.assignment(), nil
}

// packOrder returns the positions sorted by step cost, costliest first (ties
// by position, so the plan is deterministic): the radix sort of costOrder
// over the negated step costs, the order a comparison sort gives.
func (jb *job) packOrder() []int32 {
	neg := make([]float64, len(jb.stepCost))
	for i, c := range jb.stepCost {
		neg[i] = -c
	}
	return costOrder(neg)
}

// packLPT deals the cost-sorted positions to the bin whose cost they raise
// least (longest processing time first over all DP × MicroBatches bins),
// then orders each position's bins by cost so that position j is alike on
// every rank. Nil when some item fits in no bin.
func (jb *job) packLPT(order []int32) [][]int32 {
	k := jb.cfg.DP * jb.cfg.MicroBatches
	s := jb.newPackScratch(make([][]int32, k))
	if jb.cfg.Budget.Unlimited() { // every bin fits: the cheapest, from a heap
		least := newRankHeap(k)
		for _, pos := range order {
			b := least.top()
			s.add(b, pos)
			least.setTop(s.binC[b])
		}
		return s.byPosition()
	}
	for _, pos := range order {
		it := jb.items[pos]
		best := -1
		for b := range k {
			if !s.fits(b, 1, it.TextTokens, it.ImageTokens) {
				continue
			}
			if best < 0 || s.cost(b) < s.cost(best) {
				best = b
			}
		}
		if best < 0 {
			return nil
		}
		s.add(best, pos)
	}
	return s.byPosition()
}

// packLevels fills the positions one after the other: position j gets a
// level, the larger of its costliest remaining sample and the remaining cost
// spread over the remaining positions, and its DP bins are filled up to that
// level with the costliest samples that still fit (first fit decreasing);
// the last position takes the rest by LPT. A sample costlier than a fair
// bin share thus sets its position's level, and the other ranks' bins at
// that position are filled up to it instead of waiting. Nil when the budget
// cannot be met this way.
//
// Under an unlimited budget each position's bins are kept in a heap by
// (cost, rank), so that a sample looks at the cheapest bin only instead of
// scanning DP of them (levelBin); the choice is the scan's.
func (jb *job) packLevels(order []int32) [][]int32 {
	dp, m := jb.cfg.DP, jb.cfg.MicroBatches
	pl := jb.cfg.Placement
	s := jb.newPackScratch(make([][]int32, dp*m))
	var remaining float64
	for _, pos := range order {
		remaining += pl.StepCost(jb.costs[pos])
	}
	var least rankHeap // position j's bins by (cost, rank); nil under a budget
	left := slices.Clone(order)
	for j := range m {
		if jb.cfg.Budget.Unlimited() {
			least = newRankHeap(dp)
		}
		if j == m-1 {
			for _, pos := range left {
				b := s.levelBin(least, j, pos, math.Inf(1))
				if b < 0 {
					return nil
				}
				s.addAt(least, b, pos)
			}
			break
		}
		reserve := dp * (m - 1 - j) // samples the later positions need
		level := max(pl.StepCost(jb.costs[left[0]]), remaining/float64(m-j)/float64(dp))
		limit := level * (1 + packPairTolerance)
		kept := left[:0:0]
		for i, pos := range left {
			b := -1
			if len(left)-i > reserve-len(kept) || len(kept) >= reserve {
				b = s.levelBin(least, j, pos, limit)
			}
			if b < 0 {
				kept = append(kept, pos)
				continue
			}
			s.addAt(least, b, pos)
			remaining -= s.ic[pos]
		}
		for r := range dp {
			if len(s.bins[r*m+j]) == 0 {
				return nil
			}
		}
		left = kept
		if len(left) < dp*(m-1-j) {
			return nil
		}
	}
	return s.byPosition()
}

// levelBin returns the cheapest bin of position j (ties: the lowest rank)
// that takes sample pos within the budget and is empty or stays at most
// limit with it; −1 when none does. least, when not nil (unlimited budget),
// holds position j's bins by (cost, rank): the cheapest one decides unless
// it is refused and costs at most 0, when an empty bin (which costs 0) may
// follow it, so the bins are scanned as under a budget.
func (s *packScratch) levelBin(least rankHeap, j int, pos int32, limit float64) int {
	c := s.ic[pos]
	if least != nil {
		b := least.top()*s.m + j
		switch {
		case len(s.bins[b]) == 0 || !(s.cost(b)+c > limit):
			return b
		case s.cost(b) > 0: // no bin is empty, and every other costs at least as much
			return -1
		}
	}
	it := s.items[pos]
	best := -1
	for r := range s.dp {
		b := r*s.m + j
		if !s.fits(b, 1, it.TextTokens, it.ImageTokens) {
			continue
		}
		if len(s.bins[b]) > 0 && s.cost(b)+c > limit {
			continue
		}
		if best < 0 || s.cost(b) < s.cost(best) {
			best = b
		}
	}
	return best
}

// addAt adds sample pos to bin b and, when least is not nil, gives b's rank
// its new cost there.
func (s *packScratch) addAt(least rankHeap, b int, pos int32) {
	s.add(b, pos)
	if least != nil {
		least.update(b/s.m, s.binC[b])
	}
}

func (s *packScratch) add(b int, pos int32) {
	s.bins[b] = append(s.bins[b], pos)
	s.load[b] = s.load[b].Add(s.costs[pos])
	s.sumL[b] += s.items[pos].TextTokens
	s.sumP[b] += s.items[pos].ImageTokens
	s.binC[b], s.fresh[b] = s.pl.StepCost(s.load[b]), false
}

// byPosition returns the bins regrouped so that the DP bins of similar cost
// share a position: sorted by cost, costliest first, the j-th group of DP
// bins becomes position j (rank r gets the group's r-th bin, alternating
// direction per position so that rank totals stay even). Nil when a bin is
// empty.
func (s *packScratch) byPosition() [][]int32 {
	k := len(s.bins)
	idx := make([]int, k)
	for i := range idx {
		idx[i] = i
		if len(s.bins[i]) == 0 {
			return nil
		}
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(s.cost(b), s.cost(a)) })
	out := make([][]int32, k)
	for j := range s.m {
		for r := range s.dp {
			src := idx[j*s.dp+r]
			if j%2 == 1 {
				src = idx[j*s.dp+s.dp-1-r]
			}
			out[r*s.m+j] = s.bins[src]
		}
	}
	return out
}

// refinePositions levels each position's bins: it repeatedly applies the best
// move or swap of one sample between the position's costliest bin and one of
// the others, trying the cheapest bins first, while that lowers the costlier
// of the two. Under SyncStep the positions are levelled as well, which
// levels the rank totals.
func (s *packScratch) refinePositions() {
	// order holds position j's bins cheapest first, ties by higher index
	// first, so that its last is the costliest (ties to the lowest index);
	// after a move only the two bins it changed are put back in place.
	byCost := func(x, y int) int { return cmp.Or(cmp.Compare(s.cost(x), s.cost(y)), cmp.Compare(y, x)) }
	order := make([]int, s.dp)
	for j := range s.m {
		for r := range s.dp {
			order[r] = r*s.m + j
		}
		slices.SortFunc(order, byCost)
		for moves := 0; moves < packPasses*len(s.items); moves++ {
			hi := order[len(order)-1]
			moved := slices.IndexFunc(order[:min(len(order)-1, positionPartners)], func(b int) bool { return s.levelPair(hi, b) })
			if moved < 0 {
				break
			}
			b := order[moved]
			order = slices.Delete(order[:len(order)-1], moved, moved+1)
			for _, x := range [2]int{hi, b} {
				at, _ := slices.BinarySearchFunc(order, x, byCost)
				order = slices.Insert(order, at, x)
			}
		}
	}
}

func (s *packScratch) argmax(j int) int {
	best := j
	for r := 1; r < s.dp; r++ {
		if b := r*s.m + j; s.cost(b) > s.cost(best) {
			best = b
		}
	}
	return best
}

// packMove is a candidate change between two bins: sample i of bin a moves to
// bin b (k < 0) or swaps with sample k of bin b.
type packMove struct {
	i, k  int
	value float64 // the score of the pair (or the gain) it gives; lower is better
}

// sortedByCost returns bin b's member indexes sorted by the members' step
// cost, and those costs, for binary search; cached until the bin changes.
func (s *packScratch) sortedByCost(b int) ([]int, []float64) {
	if s.fresh[b] {
		return s.sorted[b], s.sortedC[b]
	}
	keyed := s.sorted[b][:0]
	for k := range s.bins[b] {
		keyed = append(keyed, k)
	}
	members := s.bins[b]
	slices.SortFunc(keyed, func(x, y int) int {
		return cmp.Compare(s.ic[members[x]], s.ic[members[y]])
	})
	cs := s.sortedC[b][:0]
	for _, k := range keyed {
		cs = append(cs, s.ic[members[k]])
	}
	s.sorted[b], s.sortedC[b], s.fresh[b] = keyed, cs, true
	return keyed, cs
}

func (s *packScratch) itemCost(pos int32) float64 { return s.ic[pos] }

// exchanges calls try with every move of a sample of a to b and, for each
// sample x of a, the swaps with the two samples of b whose cost is nearest
// below and above cost(x) − want (found by binary search): the candidates
// that shift about want from a to b. It stops, and reports true, as soon as
// try returns true (the caller has found an exchange none can beat).
func (s *packScratch) exchanges(a, b int, want float64, try func(i, k int, d Cost) bool) bool {
	sorted, sortedC := s.sortedByCost(b)
	for i, x := range s.bins[a] {
		if try(i, -1, s.costs[x]) {
			return true
		}
		at, _ := slices.BinarySearch(sortedC, s.ic[x]-want)
		for _, n := range [2]int{at - 1, at} {
			if n >= 0 && n < len(sorted) {
				k := sorted[n]
				if try(i, k, s.costs[x].Sub(s.costs[s.bins[b][k]])) {
					return true
				}
			}
		}
	}
	return false
}

// fitsExchange reports whether moving sample i of a to b (k < 0) or swapping
// it with sample k of b keeps both bins within the budget and non-empty.
func (s *packScratch) fitsExchange(a, b, i, k int) bool {
	ix := s.items[s.bins[a][i]]
	if k < 0 {
		return s.fits(a, -1, -ix.TextTokens, -ix.ImageTokens) && s.fits(b, 1, ix.TextTokens, ix.ImageTokens)
	}
	iy := s.items[s.bins[b][k]]
	dl, dp := iy.TextTokens-ix.TextTokens, iy.ImageTokens-ix.ImageTokens
	return s.fits(a, 0, dl, dp) && s.fits(b, 0, -dl, -dp)
}

// apply carries out an exchange and recounts both bins.
func (s *packScratch) apply(a, b int, e packMove) {
	x := s.bins[a][e.i]
	if e.k < 0 {
		s.bins[a] = slices.Delete(s.bins[a], e.i, e.i+1)
		s.bins[b] = append(s.bins[b], x)
	} else {
		s.bins[a][e.i], s.bins[b][e.k] = s.bins[b][e.k], x
	}
	s.recount(a)
	s.recount(b)
}

// levelPair applies the best move or swap between a and b that lowers
// max(cost(a), cost(b)) within the budget, and reports whether it applied
// one.
func (s *packScratch) levelPair(a, b int) bool {
	ca, cb := s.cost(a), s.cost(b)
	cur := max(ca, cb)
	if ca-cb <= packPairTolerance*cur {
		return false
	}
	best := packMove{i: -1, value: cur * (1 - packMinGain)}
	s.exchanges(a, b, (ca-cb)/2, func(i, k int, d Cost) bool {
		v := max(s.pl.StepCost(s.load[a].Sub(d)), s.pl.StepCost(s.load[b].Add(d)))
		if v < best.value && s.fitsExchange(a, b, i, k) {
			best = packMove{i, k, v}
		}
		return false
	})
	if best.i < 0 {
		return false
	}
	s.apply(a, b, best)
	return true
}

// refineAcross moves or swaps samples between the costliest bin of one
// position and a bin of another position when that lowers the score
// (SyncMicroBatch with more than one position): a position whose level a
// large sample sets can absorb work from the others. The score change of a
// candidate is computed from the two positions' two largest bin costs; the
// first exchange with the largest gain is taken.
//
// No exchange gains more than ceiling, the drop of a's position to its
// second costliest bin (drop ≤ ceiling and rise ≥ 0, and rounding keeps
// that order), so the scan of a position stops at the first exchange that
// gains exactly ceiling: a later one could only tie it, and a tie keeps the
// first. On a levelled plan most winning exchanges do (all 62 taken on the
// bench's 4,096 samples on 64 ranks), and the refinement evaluates 52,000
// candidates instead of 451,000, with the same result.
func (s *packScratch) refineAcross() {
	if s.sync != SyncMicroBatch || s.m == 1 {
		return
	}
	tops := make([]float64, s.m)
	for range packPasses * s.m {
		improved := false
		for ja := range s.m {
			a := s.argmax(ja)
			ca := s.cost(a)
			roomA := ca - s.secondMax(ja, a)
			if roomA <= 0 {
				continue
			}
			ceiling := ca - (ca - roomA)
			best, bestB := packMove{i: -1}, -1
			for j := range s.m {
				tops[j] = s.positionMax(j)
			}
			for b := range s.bins {
				jb := b % s.m
				if jb == ja {
					continue
				}
				top := tops[jb]
				roomB := top - s.cost(b)
				if roomB <= 0 {
					continue
				}
				done := s.exchanges(a, b, min(roomA, roomB), func(i, k int, d Cost) bool {
					na, nb := s.pl.StepCost(s.load[a].Sub(d)), s.pl.StepCost(s.load[b].Add(d))
					drop := ca - max(na, ca-roomA)
					rise := max(0, nb-top)
					if g := drop - rise; g > best.value && g > ca*packMinGain && s.fitsExchange(a, b, i, k) {
						best, bestB = packMove{i, k, g}, b
					}
					return best.value >= ceiling
				})
				if done {
					break
				}
			}
			if bestB >= 0 {
				s.apply(a, bestB, best)
				improved = true
			}
		}
		if !improved {
			return
		}
	}
}

// secondMax returns the largest bin cost of position j other than bin a's.
func (s *packScratch) secondMax(j, a int) float64 {
	var hi float64
	for r := range s.dp {
		if b := r*s.m + j; b != a {
			hi = max(hi, s.cost(b))
		}
	}
	return hi
}

// assignment copies the bins out: a rank's micro-batches costliest first
// (position order is kept when it already is), entries longest text first.
func (s *packScratch) assignment() Assignment {
	a := Assignment{DP: s.dp, MicroBatches: s.m, Members: make([][]int32, len(s.bins))}
	byLen := func(x, y int32) int {
		if c := cmp.Compare(s.items[y].TextTokens, s.items[x].TextTokens); c != 0 {
			return c
		}
		return cmp.Compare(x, y)
	}
	for b, members := range s.bins {
		mb := slices.Clone(members)
		slices.SortFunc(mb, byLen)
		a.Members[b] = mb
	}
	if s.sync == SyncStep {
		for r := range s.dp {
			rank := a.Members[r*s.m : (r+1)*s.m]
			slices.SortStableFunc(rank, func(x, y []int32) int {
				return cmp.Compare(s.pl.StepCost(packedCost(s.costs, y)), s.pl.StepCost(packedCost(s.costs, x)))
			})
		}
	}
	return a
}

// packedCost returns Σ costs over members (without the overhead).
func packedCost(costs []Cost, members []int32) Cost {
	var c Cost
	for _, pos := range members {
		c = c.Add(costs[pos])
	}
	return c
}
