package balancer

import (
	"cmp"
	"slices"
)

// window is the redeal's state: the window's steps, each split into DP
// virtual ranks (bins) that stand for the ranks the partitioner will form.
type window struct {
	dp, minCount int
	cost         func(member) float64
	bins         [][]member // bins[k*dp+r]
	load         []float64
}

// redeal spreads the samples of a lookahead window over its steps so that
// every step can be split evenly over its ranks (docs/cost-model.md,
// "Lookahead"). It deals the samples, heaviest first, over the window's
// steps × DP virtual ranks (LPT), each to the least loaded virtual rank of a
// step that has room (its original sample count, or the token budget) and
// is not more than one sample per rank ahead of its proportional share; then
// it levels every step and repairs the worst steps by swapping samples
// between steps. Delay is bounded by the window. When the token budget
// cannot be met (or the window has one step) the arrival order is kept.
func (b *builder) redeal(win []batch) [][]member {
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
	pl := b.cfg.Placement
	cost := func(m member) float64 { return pl.StepCost(b.costs[m.item]) }
	slices.SortFunc(pool, func(x, y member) int {
		if c := cmp.Compare(cost(y), cost(x)); c != 0 {
			return c
		}
		return cmp.Compare(x.item, y.item)
	})
	w, ok := b.deal(win, pool, cost)
	if !ok {
		return keep()
	}
	w.settle(len(pool), b.cfg.GlobalTokens == 0)
	if b.cfg.GlobalTokens == 0 {
		if l := b.dealLayers(win, pool, cost); l.worse(w) < 0 {
			w = l
		}
	}
	out := make([][]member, len(win))
	for k := range out {
		for _, bin := range w.bins[k*w.dp : (k+1)*w.dp] {
			out[k] = append(out[k], bin...)
		}
		if len(out[k]) < b.cfg.DP*b.cfg.MicroBatches {
			return keep()
		}
		slices.SortFunc(out[k], func(x, y member) int { return cmp.Compare(x.item, y.item) })
	}
	return out
}

// deal assigns the cost-sorted pool to the window's virtual ranks (LPT with
// room and proportional-share limits). It reports false when a sample finds
// no step with room (token budget).
func (b *builder) deal(win []batch, pool []member, cost func(member) float64) (*window, bool) {
	dp := b.cfg.DP
	w := &window{dp: dp, minCount: b.cfg.MicroBatches, cost: cost,
		bins: make([][]member, len(win)*dp), load: make([]float64, len(win)*dp)}
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
			if !room {
				continue
			}
			for v := k * dp; v < (k+1)*dp; v++ {
				if best < 0 || w.load[v] < w.load[best] {
					best = v
				}
			}
		}
		if best < 0 {
			return nil, false
		}
		k := best / dp
		w.bins[best] = append(w.bins[best], m)
		w.load[best] += cost(m)
		count[k]++
		tokens[k] += l
	}
	return w, true
}

// dealLayers cuts the cost-sorted pool into layers of DP samples of similar
// cost and gives whole layers to steps, in serpentine order over the steps
// with room; within a step, LPT spreads the samples over the virtual ranks.
// A step of whole layers can give every rank one sample of each layer, so it
// balances however lumpy the costs are; the steps' means may differ, which
// the per-step imbalance does not mind. It is the alternative to deal when a
// window's heavy samples cannot be spread evenly over all its virtual ranks
// (e.g. 41 samples of half a rank's share in 32 virtual ranks).
func (b *builder) dealLayers(win []batch, pool []member, cost func(member) float64) *window {
	dp := b.cfg.DP
	w := &window{dp: dp, minCount: b.cfg.MicroBatches, cost: cost,
		bins: make([][]member, len(win)*dp), load: make([]float64, len(win)*dp)}
	count := make([]int, len(win))
	order := make([]int, 0, 2*len(win)) // serpentine: 0 1 … W-1 W-1 … 0
	for k := range win {
		order = append(order, k)
	}
	for k := len(win) - 1; k >= 0; k-- {
		order = append(order, k)
	}
	turn := 0
	for start := 0; start < len(pool); start += dp {
		layer := pool[start:min(start+dp, len(pool))]
		placed := false
		for range order {
			k := order[turn%len(order)]
			turn++
			if len(win[k].items)-count[k] >= len(layer) {
				for _, m := range layer {
					w.add(k, m)
				}
				count[k] += len(layer)
				placed = true
				break
			}
		}
		for i := 0; !placed && i < len(layer); i++ { // no step holds the whole layer
			k := 0
			for kk := range win {
				if len(win[kk].items)-count[kk] > len(win[k].items)-count[k] {
					k = kk
				}
			}
			w.add(k, layer[i])
			count[k]++
		}
	}
	w.settle(len(pool), true)
	return w
}

// add puts m on step k's least loaded virtual rank.
func (w *window) add(k int, m member) {
	best := k * w.dp
	for v := k * w.dp; v < (k+1)*w.dp; v++ {
		if w.load[v] < w.load[best] {
			best = v
		}
	}
	w.bins[best] = append(w.bins[best], m)
	w.load[best] += w.cost(m)
}

// settle levels every step and, when steps may trade samples (count mode),
// repairs the worst ones.
func (w *window) settle(samples int, repair bool) {
	for k := range len(w.bins) / w.dp {
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
		for k := range len(x.bins) / x.dp {
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

// extremes returns step k's most and least loaded virtual ranks and its mean.
func (w *window) extremes(k int) (hi, lo int, mean float64) {
	hi, lo = k*w.dp, k*w.dp
	var sum float64
	for v := k * w.dp; v < (k+1)*w.dp; v++ {
		sum += w.load[v]
		if w.load[v] > w.load[hi] {
			hi = v
		}
		if w.load[v] < w.load[lo] {
			lo = v
		}
	}
	return hi, lo, sum / float64(w.dp)
}

// imbalance returns step k's virtual max / mean (1 for an empty step).
func (w *window) imbalance(k int) float64 {
	hi, _, mean := w.extremes(k)
	if mean <= 0 {
		return 1
	}
	return w.load[hi] / mean
}

// level evens out step k: while it lowers the pair's maximum, it moves a
// sample from the most loaded virtual rank to the least loaded one, or swaps
// a sample of each, choosing the transfer closest to half their gap.
func (w *window) level(k int) {
	for range 4 * w.dp * w.dp {
		hi, lo, _ := w.extremes(k)
		gap := w.load[hi] - w.load[lo]
		if gap <= 0 {
			return
		}
		bx, by, bestD := -1, -1, gap/2 // transfer t misses gap/2 by |gap/2 − t| < gap/2
		for x, mx := range w.bins[hi] {
			cx := w.cost(mx)
			if len(w.bins[hi]) > w.minCount && cx < gap {
				if d := abs(gap/2 - cx); d < bestD {
					bx, by, bestD = x, -1, d
				}
			}
			for y, my := range w.bins[lo] {
				if t := cx - w.cost(my); t > 0 && t < gap {
					if d := abs(gap/2 - t); d < bestD {
						bx, by, bestD = x, y, d
					}
				}
			}
		}
		if bx < 0 {
			return
		}
		mx := w.bins[hi][bx]
		t := w.cost(mx)
		if by >= 0 {
			my := w.bins[lo][by]
			t -= w.cost(my)
			w.bins[hi][bx], w.bins[lo][by] = my, mx
		} else {
			w.bins[hi] = slices.Delete(w.bins[hi], bx, bx+1)
			w.bins[lo] = append(w.bins[lo], mx)
		}
		w.load[hi] -= t
		w.load[lo] += t
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// swapCandidate is a cross-step swap: sample x of virtual rank v (the worst
// step's heaviest) for sample y of virtual rank u in another step.
type swapCandidate struct {
	v, x, u, y int
	miss       float64 // distance of the transfer from the wanted one
}

// repair lowers the window's worst virtual imbalance by swapping a sample of
// the worst step's heaviest virtual rank for a cheaper sample of another step,
// or a sample of its lightest for a costlier one, and levelling both steps;
// sample counts per step are kept. It evaluates the swaps whose transfer is
// closest to the heaviest rank's excess (the lightest rank's shortfall) and
// stops when the worst step is within repairTolerance or no swap improves it.
func (w *window) repair(samples int) {
	steps := len(w.bins) / w.dp
	for range 2 * samples {
		worst, imb := 0, 0.0
		for k := range steps {
			if i := w.imbalance(k); i > imb {
				worst, imb = k, i
			}
		}
		if imb <= 1+repairTolerance {
			return
		}
		hi, lo, mean := w.extremes(worst)
		cands := append(w.swapCandidates(worst, hi, w.load[hi]-mean, 1),
			w.swapCandidates(worst, lo, w.load[hi]-w.load[lo], -1)...)
		bestScore := imb
		var best *window
		for _, c := range cands {
			n := w.trySwap(worst, c)
			if s := max(n.imbalance(worst), n.imbalance(c.u/w.dp)); s < bestScore*(1-minGain) {
				bestScore, best = s, n
			}
		}
		if best == nil {
			return
		}
		w.bins, w.load = best.bins, best.load
	}
}

// swapCandidates returns up to repairCandidates swaps of a sample of virtual
// rank v (step k) for a cheaper (sign +1: v exports cost) or costlier (sign
// −1: v imports cost) sample of another step, the transfer closest to want
// first (ties by positions, for determinism).
func (w *window) swapCandidates(k, v int, want, sign float64) []swapCandidate {
	var out []swapCandidate
	for x, mx := range w.bins[v] {
		cx := w.cost(mx)
		for u := range w.bins {
			if u/w.dp == k {
				continue
			}
			for y, my := range w.bins[u] {
				d := sign * (cx - w.cost(my))
				if d <= 0 {
					continue
				}
				c := swapCandidate{v: v, x: x, u: u, y: y, miss: abs(d - want)}
				if len(out) < repairCandidates {
					out = append(out, c)
					continue
				}
				if worst := slices.MaxFunc(out, candidateCmp); candidateCmp(c, worst) < 0 {
					out[slices.Index(out, worst)] = c
				}
			}
		}
	}
	slices.SortFunc(out, candidateCmp)
	return out
}

func candidateCmp(a, b swapCandidate) int {
	if c := cmp.Compare(a.miss, b.miss); c != 0 {
		return c
	}
	return cmp.Or(cmp.Compare(a.v, b.v), cmp.Compare(a.x, b.x), cmp.Compare(a.u, b.u), cmp.Compare(a.y, b.y))
}

// trySwap returns a copy of the window with candidate c applied and the two
// steps levelled. Only the two steps' bins are copied.
func (w *window) trySwap(k int, c swapCandidate) *window {
	n := &window{dp: w.dp, minCount: w.minCount, cost: w.cost,
		bins: slices.Clone(w.bins), load: slices.Clone(w.load)}
	k2 := c.u / w.dp
	for _, s := range []int{k, k2} {
		for v := s * w.dp; v < (s+1)*w.dp; v++ {
			n.bins[v] = slices.Clone(w.bins[v])
		}
	}
	mx, my := n.bins[c.v][c.x], n.bins[c.u][c.y]
	n.bins[c.v][c.x], n.bins[c.u][c.y] = my, mx
	d := w.cost(mx) - w.cost(my)
	n.load[c.v] -= d
	n.load[c.u] += d
	n.level(k)
	n.level(k2)
	return n
}
