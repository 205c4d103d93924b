package balancer

import (
	"cmp"
	"slices"
)

// redeal spreads the samples of a lookahead window over its steps so that
// every step can be split evenly over its ranks (docs/cost-model.md,
// "Balancing"). The samples are sorted by cost and dealt to the window's
// steps × DP virtual ranks (choose: whole layers of DP similar samples,
// spread over the steps or stacked, or LPT), levelled per step and, when no
// deal is even, repaired by swapping samples between steps. Sample counts
// per step are kept and delay is bounded by the window. When the token
// budget cannot be met (or the window has one step) the arrival order is
// kept.
func (b *builder) redeal(win []batch, stack bool) [][]member {
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
	type priced struct {
		cost float64
		m    member
	}
	sorted := make([]priced, len(pool))
	for i, m := range pool {
		sorted[i] = priced{b.cfg.Placement.StepCost(b.costs[m.item]), m}
	}
	slices.SortFunc(sorted, func(x, y priced) int {
		return cmp.Or(cmp.Compare(y.cost, x.cost), cmp.Compare(x.m.item, y.m.item))
	})
	c := make([]float64, len(pool))
	for i, p := range sorted {
		pool[i], c[i] = p.m, p.cost
	}
	w, ok := b.choose(win, pool, c, stack)
	if !ok {
		return keep()
	}
	out := make([][]member, len(win))
	for k := range out {
		for _, bin := range w.bins[k*w.dp : (k+1)*w.dp] {
			for _, i := range bin {
				out[k] = append(out[k], pool[i])
			}
		}
		if len(out[k]) < b.cfg.DP*b.cfg.MicroBatches {
			return keep()
		}
		slices.SortFunc(out[k], func(x, y member) int { return cmp.Compare(x.item, y.item) })
	}
	return out
}

// choose returns the settled window of the best deal (deal, or the layered
// deals in count mode). Cheapest first: the layers spread over the steps,
// then (with stack) stacked, the costliest layers together in the first
// step, each only levelled, then the stacked one repaired; the first that is
// within repairTolerance on every step is taken. Otherwise the deal and the
// spread layers are repaired too and the best (window.worse) wins.
func (b *builder) choose(win []batch, pool []member, c []float64, stack bool) (*window, bool) {
	if b.cfg.GlobalTokens > 0 {
		w, ok := b.deal(win, pool, c)
		if ok {
			w.settle(len(pool), false)
		}
		return w, ok
	}
	kinds := []bool{false} // spread
	if stack {
		kinds = append(kinds, true)
	}
	var tried []*window
	for _, stacked := range kinds {
		l := b.dealLayers(win, c, stacked)
		l.settle(len(pool), false)
		if l.even() {
			return l, true
		}
		tried = append(tried, l)
	}
	if stack {
		if tried[1].repair(len(pool)); tried[1].even() {
			return tried[1], true
		}
	}
	w, ok := b.deal(win, pool, c)
	if !ok {
		return nil, false
	}
	w.settle(len(pool), true)
	for i, l := range tried {
		if i == 0 {
			l.repair(len(pool)) // the stacked one is repaired already
		}
		if l.worse(w) < 0 {
			w = l
		}
	}
	return w, true
}

// even reports whether every step is within repairTolerance of even.
func (w *window) even() bool {
	for k := range w.steps() {
		if w.imbalance(k) > 1+repairTolerance {
			return false
		}
	}
	return true
}

// deal assigns the cost-sorted pool (costs c) to the window's virtual ranks
// (LPT with room and proportional-share limits). It reports false when a
// sample finds no step with room (token budget).
func (b *builder) deal(win []batch, pool []member, c []float64) (*window, bool) {
	dp := b.cfg.DP
	w := newWindow(len(win), dp, b.cfg.MicroBatches, c)
	count := make([]int, len(win))
	tokens := make([]int, len(win))
	for i, m := range pool {
		best := -1
		l := b.cfg.stepTokens(b.items[m.item])
		for k, bt := range win {
			room := count[k] < len(bt.items)
			if b.cfg.GlobalTokens > 0 {
				room = tokens[k]+l <= b.cfg.GlobalTokens
			} else if share := (i + 1) * len(bt.items) / len(pool); count[k] >= share+dp {
				room = false // a step ahead of its share would fill up with heavy samples
			}
			if v := w.least(k); room && (best < 0 || w.load[v] < w.load[best]) {
				best = v
			}
		}
		if best < 0 {
			return nil, false
		}
		w.put(best, int32(i))
		count[best/dp]++
		tokens[best/dp] += l
	}
	return w, true
}

// dealLayers cuts the cost-sorted pool into layers of DP samples of similar
// cost and gives whole layers to steps: spread, in serpentine order over the
// steps with room, or stacked, the costliest layers filling the first step,
// the next the second, and so on; within a step, LPT spreads the samples over
// the virtual ranks. A step of whole layers can give every rank one sample of
// each layer, so it balances however lumpy the costs are; the steps' means
// may differ, which the per-step imbalance does not mind. Spread keeps every
// step a mix of the window's costs; stacked is what balances a heavy tail: a
// step that holds a few samples each worth a large part of a rank's share
// (or, under micro-batch sync, of a micro-batch's) can be even only if its
// other samples are costly too (at dp 1,024 × 16,384 samples per step, 4
// micro-batches, the stacked window's worst virtual imbalance was 1.0006
// where spread layers repaired reached 1.31 and the deal 1.49).
func (b *builder) dealLayers(win []batch, c []float64, stacked bool) *window {
	dp := b.cfg.DP
	w := newWindow(len(win), dp, b.cfg.MicroBatches, c)
	count := make([]int, len(win))
	var order []int
	if stacked {
		for k := range win {
			for range (len(win[k].items) + dp - 1) / dp {
				order = append(order, k)
			}
		}
	} else { // serpentine: 0 1 … W-1 W-1 … 0
		for k := range win {
			order = append(order, k)
		}
		for k := len(win) - 1; k >= 0; k-- {
			order = append(order, k)
		}
	}
	turn := 0
	for start := 0; start < len(c); start += dp {
		end := min(start+dp, len(c))
		placed := false
		for range order {
			k := order[turn%len(order)]
			turn++
			if len(win[k].items)-count[k] >= end-start {
				for i := start; i < end; i++ {
					w.put(w.least(k), int32(i))
				}
				count[k] += end - start
				placed = true
				break
			}
		}
		for i := start; !placed && i < end; i++ { // no step holds the whole layer
			k := 0
			for kk := range win {
				if len(win[kk].items)-count[kk] > len(win[k].items)-count[k] {
					k = kk
				}
			}
			w.put(w.least(k), int32(i))
			count[k]++
		}
	}
	return w
}

// settle levels every step and, when steps may trade samples (count mode),
// repairs the worst ones.
func (w *window) settle(samples int, repair bool) {
	for k := range w.steps() {
		w.level(k)
	}
	if repair {
		w.repair(samples)
	}
}

// worse compares two settled windows by their worst step's virtual
// imbalance, then the sum over steps of the heaviest virtual rank (the
// predicted time): negative when w is better than o.
func (w *window) worse(o *window) int {
	score := func(x *window) (float64, float64) {
		var worst, sum float64
		for k := range x.steps() {
			worst = max(worst, x.imbalance(k))
			hi, _, _ := x.extremes(k)
			sum += x.load[hi]
		}
		return worst, sum
	}
	wa, ws := score(w)
	oa, os := score(o)
	return cmp.Or(cmp.Compare(wa, oa), cmp.Compare(ws, os))
}

// level evens out step k: while it lowers the pair's maximum and the step is
// more than levelTolerance above even, it moves a sample from the most loaded
// virtual rank to the least loaded one, or swaps a sample of each, choosing
// the transfer closest to half their gap.
func (w *window) level(k int) { w.levelN(k, levelMoves*w.dp) }

func (w *window) levelN(k, n int) {
	for range n {
		hi, lo, mean := w.extremes(k)
		gap := w.load[hi] - w.load[lo]
		if gap <= 0 || w.load[hi] <= mean*(1+levelTolerance) {
			return
		}
		bx, by, bestD := -1, -1, gap/2 // transfer t misses gap/2 by |gap/2 − t| < gap/2
		canMove := len(w.bins[hi]) > w.minCount
		for x, ix := range w.bins[hi] {
			cx := w.c[ix]
			if canMove && cx < gap {
				if d := abs(gap/2 - cx); d < bestD {
					bx, by, bestD = x, -1, d
				}
			}
			for y, iy := range w.bins[lo] {
				if t := cx - w.c[iy]; t > 0 && t < gap {
					if d := abs(gap/2 - t); d < bestD {
						bx, by, bestD = x, y, d
					}
				}
			}
		}
		switch {
		case bx < 0:
			return
		case by >= 0:
			w.swap(hi, bx, lo, by)
		default:
			w.move(hi, bx, lo)
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// swapCandidate is a cross-step swap: the member at position x of virtual
// rank v (in the worst step) for the member at position y of virtual rank u
// in another step; xi, yi are their pool indices.
type swapCandidate struct {
	v, x, u, y int
	xi, yi     int32
	miss       float64 // distance of the transfer from the wanted one
}

// repair lowers the window's worst virtual imbalance by swapping a sample of
// the worst step's heaviest virtual rank for a cheaper sample of another step,
// or a sample of its lightest for a costlier one, and levelling both steps;
// sample counts per step are kept. It evaluates the swaps whose transfer is
// closest to the heaviest rank's excess (the lightest rank's shortfall) and
// stops when the worst step is within repairTolerance or no swap improves it.
func (w *window) repair(samples int) {
	var cands []swapCandidate
	for range 2 * samples {
		worst, imb, next := 0, 0.0, 0.0 // next: the worst imbalance of the other steps
		for k := range w.steps() {
			if i := w.imbalance(k); i > imb {
				worst, imb, next = k, i, imb
			} else {
				next = max(next, i)
			}
		}
		if imb <= 1+repairTolerance {
			break
		}
		hi, lo, mean := w.extremes(worst)
		cands = w.swapCandidates(cands[:0], worst, hi, w.load[hi]-mean, 1)
		cands = w.swapCandidates(cands, worst, lo, w.load[hi]-w.load[lo], -1)
		best, bestScore := -1, imb
		for i, c := range cands {
			if s := w.try(worst, c); s < bestScore*(1-minGain) {
				best, bestScore = i, s
				if s <= next {
					break // the step is no longer the window's worst: good enough
				}
			}
		}
		if best < 0 {
			break
		}
		w.apply(worst, cands[best])
	}
	for k := range w.steps() {
		w.level(k)
	}
}

// try returns the worse of the two steps' virtual imbalances after candidate
// c, and leaves the window as it was.
func (w *window) try(k int, c swapCandidate) float64 {
	w.recording = true
	k2 := w.apply(k, c)
	s := max(w.imbalance(k), w.imbalance(k2))
	w.undo()
	return s
}

// apply swaps candidate c and levels both steps with at most repairLevel
// exchanges each (the repair levels every step in full when it ends); it
// returns the other step.
func (w *window) apply(k int, c swapCandidate) int {
	w.swap(c.v, c.x, c.u, c.y)
	k2 := c.u / w.dp
	w.levelN(k, repairLevel)
	w.levelN(k2, repairLevel)
	return k2
}

// swapCandidates appends to out the up to repairCandidates swaps of a member
// of virtual rank v (step k) for a cheaper (sign +1: v exports cost) or
// costlier (sign −1: v imports cost) member of another step whose transfer is
// closest to want (ties by pool indices, for determinism). The pool is sorted
// by cost, so for each member of v the search starts where the wanted partner
// cost would be and walks outwards while it can still beat the worst kept.
func (w *window) swapCandidates(out []swapCandidate, k, v int, want, sign float64) []swapCandidate {
	top := make([]swapCandidate, 0, repairCandidates)
	worst := 0 // index in top of the worst kept candidate once top is full
	offer := func(c swapCandidate) bool {
		if len(top) == repairCandidates {
			if candidateCmp(c, top[worst]) >= 0 {
				return false
			}
			top[worst] = c
		} else {
			top = append(top, c)
		}
		for i := range top {
			if candidateCmp(top[i], top[worst]) > 0 {
				worst = i
			}
		}
		return true
	}
	for x, xi := range w.bins[v] {
		cx := w.c[xi]
		target := cx - sign*want // the partner cost that transfers exactly want
		// the first pool index whose cost is ≤ target (costs are non-increasing)
		j0, _ := slices.BinarySearchFunc(w.c, target, func(ci, t float64) int { return cmp.Compare(t, ci) })
		for _, dir := range [2]int{1, -1} {
			j := j0
			if dir < 0 {
				j--
			}
			for ; j >= 0 && j < len(w.c); j += dir {
				cy := w.c[j]
				if sign*(cx-cy) <= 0 {
					break // past cx: the transfer would go the wrong way
				}
				u := int(w.at[j])
				if u/w.dp == k {
					continue
				}
				c := swapCandidate{v: v, x: x, u: u, y: slices.Index(w.bins[u], int32(j)), xi: xi, yi: int32(j), miss: abs(cy - target)}
				if !offer(c) {
					break // farther partners miss by more
				}
			}
		}
	}
	slices.SortFunc(top, candidateCmp)
	return append(out, top...)
}

func candidateCmp(a, b swapCandidate) int {
	if c := cmp.Compare(a.miss, b.miss); c != 0 {
		return c
	}
	return cmp.Or(cmp.Compare(a.xi, b.xi), cmp.Compare(a.yi, b.yi))
}
