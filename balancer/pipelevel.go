package balancer

import (
	"slices"
)

// levelPipeline lowers the pipelined step cost of a (PartitionConfig.PP > 1)
// by moving single entries out of the step's costliest micro-batch into
// another one, of the same or another rank, while that lowers the cost by
// more than minGain and the budget holds; every micro-batch keeps at least
// one entry. It returns a with each rank's micro-batches costliest first
// again. A move is priced incrementally (pipeLevel.eval, O(M log M)) and may
// go to the costliest micro-batch's own rank or to the levelTargets cheapest
// micro-batches of the step, so a pass over 4,096 samples on 64 ranks × 4
// stays within the partitioner's own time.
func (jb *job) levelPipeline(a Assignment) Assignment {
	m := jb.cfg.MicroBatches
	if jb.cfg.pp() <= 1 || m == 1 || jb.cfg.Refinement != RefineLocalSearch {
		return a
	}
	st := newPipeLevel(jb, a)
	for range pipeMovesPerSlot * len(st.members) {
		if !st.step() {
			break
		}
	}
	return jb.ordered(st.members, st.cost)
}

// ranked is a value with the rank or slot it belongs to.
type ranked struct {
	v float64
	r int
}

// top3 keeps the three largest values with distinct owners.
type top3 [3]ranked

func (t *top3) add(v float64, r int) {
	x := ranked{v, r}
	for i := range t {
		if x.v > t[i].v {
			t[i], x = x, t[i]
		}
	}
}

// without returns the largest value whose owner is neither a nor b.
func (t *top3) without(a, b int) float64 {
	for _, x := range t {
		if x.r != a && x.r != b {
			return x.v
		}
	}
	return 0
}

// pipeLevel is levelPipeline's state: the micro-batches, their shapes and
// costs, and per-rank and per-position summaries that price a move of one
// entry between two micro-batches without recomputing the step.
type pipeLevel struct {
	jb      *job
	m, pp   int
	members [][]int32
	shape   []mbShape
	sumL    []int
	feat    []Features // packed feature sums
	cost    []float64
	sorted  [][]float64 // per rank, its micro-batch costs descending
	rankT   top3        // PipelineRankCost by rank
	pos     []top3      // per position, the largest costs by rank
	bufA    []float64
	bufB    []float64
	cur     float64
}

func newPipeLevel(jb *job, a Assignment) *pipeLevel {
	p := jb.Partitioner
	k := len(a.Members)
	st := &pipeLevel{jb: jb, m: p.cfg.MicroBatches, pp: p.cfg.pp(), members: make([][]int32, k),
		shape: make([]mbShape, k), sumL: make([]int, k), feat: make([]Features, k), cost: make([]float64, k),
		sorted: make([][]float64, p.cfg.DP), pos: make([]top3, p.cfg.MicroBatches),
		bufA: make([]float64, p.cfg.MicroBatches), bufB: make([]float64, p.cfg.MicroBatches)}
	for i, mb := range a.Members {
		st.members[i] = slices.Clone(mb)
		st.rebuild(i)
	}
	st.summarise()
	return st
}

// rebuild recomputes slot i's shape, features and cost from its members.
func (st *pipeLevel) rebuild(i int) {
	st.shape[i], st.sumL[i], st.feat[i] = mbShape{}, 0, Features{}
	for _, pos := range st.members[i] {
		it := st.jb.items[pos]
		st.shape[i].add(it)
		st.sumL[i] += it.TextTokens
		st.feat[i] = st.feat[i].Add(FeaturesOf(it.TextTokens, it.ImageTokens, it.Complexity))
	}
	st.cost[i] = st.price(st.shape[i], st.feat[i])
}

// price returns the step cost of a micro-batch of shape s (padded) or
// features f (packed).
func (st *pipeLevel) price(s mbShape, f Features) float64 {
	p := st.jb
	if !p.cfg.Pack {
		f = s.features()
	}
	return p.cfg.Placement.StepCost(p.model.MicroBatchCost(f, p.cfg.Pack))
}

// summarise recomputes the per-rank sorted costs, the rank costs' top three,
// the per-position top three and the current step cost.
func (st *pipeLevel) summarise() {
	st.rankT = top3{}
	clear(st.pos)
	for r := range st.sorted {
		st.sorted[r] = sortDesc(append(st.sorted[r][:0], st.cost[r*st.m:(r+1)*st.m]...))
		st.rankT.add(PipelineRankCost(st.sorted[r], st.pp), r)
		for j, c := range st.sorted[r] {
			st.pos[j].add(c, r)
		}
	}
	st.cur = st.eval(-1, -1, nil, nil)
}

// eval returns the step cost with ranks ra and rb (−1: none) running the
// micro-batch costs newA and newB (descending) instead of their own.
func (st *pipeLevel) eval(ra, rb int, newA, newB []float64) float64 {
	worst := st.rankT.without(ra, rb)
	if newA != nil {
		worst = max(worst, PipelineRankCost(newA, st.pp))
	}
	if newB != nil {
		worst = max(worst, PipelineRankCost(newB, st.pp))
	}
	if st.jb.cfg.Sync != SyncMicroBatch {
		return worst
	}
	var sum, hi float64
	for j := range st.pos {
		t := st.pos[j].without(ra, rb)
		if newA != nil {
			t = max(t, newA[j])
		}
		if newB != nil {
			t = max(t, newB[j])
		}
		sum += t
		hi = max(hi, t)
	}
	return max(worst, (sum+float64(st.pp-1)*hi)/float64(st.pp))
}

// step applies the best improving move out of the costliest micro-batch;
// false when there is none.
func (st *pipeLevel) step() bool {
	hi := 0
	for k, c := range st.cost {
		if c > st.cost[hi] {
			hi = k
		}
	}
	if len(st.members[hi]) < 2 {
		return false
	}
	best, bestI, bestK := st.cur, -1, -1
	rh := hi / st.m
	targets := st.targets(hi)
	for i := range st.members[hi] {
		cFrom := st.costWithout(hi, i)
		item := st.jb.items[st.members[hi][i]]
		for _, k := range targets {
			cTo, ok := st.costWith(k, item)
			if !ok || cTo >= st.cost[hi] { // the step's costliest micro-batch would not shrink
				continue
			}
			c := st.evalMove(rh, hi, k, cFrom, cTo)
			if c < best*(1-minGain) {
				best, bestI, bestK = c, i, k
			}
		}
	}
	if bestK < 0 {
		return false
	}
	pos := st.members[hi][bestI]
	st.members[hi] = slices.Delete(st.members[hi], bestI, bestI+1)
	st.members[bestK] = append(st.members[bestK], pos)
	st.rebuild(hi)
	st.rebuild(bestK)
	st.summarise()
	return true
}

// targets returns the slots an entry of slot hi may move to: the other
// micro-batches of its rank and the levelTargets cheapest of the step.
func (st *pipeLevel) targets(hi int) []int {
	rh := hi / st.m
	out := make([]int, 0, st.m+levelTargets)
	for k := rh * st.m; k < (rh+1)*st.m; k++ {
		if k != hi {
			out = append(out, k)
		}
	}
	var cheap cheapest
	for k, c := range st.cost {
		if k/st.m != rh {
			cheap.add(c, k)
		}
	}
	for _, x := range cheap.v[:cheap.n] {
		out = append(out, x.r)
	}
	return out
}

// cheapest keeps the levelTargets smallest values with their slots.
type cheapest struct {
	v [levelTargets]ranked
	n int
}

func (t *cheapest) add(c float64, k int) {
	x := ranked{c, k}
	if t.n < levelTargets {
		t.v[t.n] = x
		t.n++
	} else if x.v >= t.v[levelTargets-1].v {
		return
	} else {
		t.v[levelTargets-1] = x
	}
	for i := t.n - 1; i > 0 && t.v[i].v < t.v[i-1].v; i-- {
		t.v[i], t.v[i-1] = t.v[i-1], t.v[i]
	}
}

// evalMove prices slot hi (of rank rh) at cFrom and slot k at cTo.
func (st *pipeLevel) evalMove(rh, hi, k int, cFrom, cTo float64) float64 {
	rk := k / st.m
	a := st.replaced(st.bufA, rh, hi, cFrom)
	if rk == rh {
		a = st.replaced(a, -1, k, cTo)
		return st.eval(rh, -1, sortDesc(a), nil)
	}
	b := st.replaced(st.bufB, rk, k, cTo)
	return st.eval(rh, rk, sortDesc(a), sortDesc(b))
}

// replaced returns rank r's slot costs (or buf itself when r < 0) with slot
// k's cost set to c, in buf.
func (st *pipeLevel) replaced(buf []float64, r, k int, c float64) []float64 {
	if r >= 0 {
		buf = append(buf[:0], st.cost[r*st.m:(r+1)*st.m]...)
	}
	buf[k%st.m] = c
	return buf
}

// costWithout returns slot k's cost without its i-th member.
func (st *pipeLevel) costWithout(k, i int) float64 {
	var s mbShape
	var f Features
	for j, pos := range st.members[k] {
		if j == i {
			continue
		}
		it := st.jb.items[pos]
		s.add(it)
		f = f.Add(FeaturesOf(it.TextTokens, it.ImageTokens, it.Complexity))
	}
	return st.price(s, f)
}

// costWith returns slot k's cost with it added, and whether that fits the
// budget.
func (st *pipeLevel) costWith(k int, it Item) (float64, bool) {
	s := st.shape[k]
	s.add(it)
	b := st.jb.cfg.Budget
	if st.jb.cfg.Pack {
		if !b.FitsPacked(s.count, st.sumL[k]+it.TextTokens, s.sumP) {
			return 0, false
		}
		return st.price(s, st.feat[k].Add(FeaturesOf(it.TextTokens, it.ImageTokens, it.Complexity))), true
	}
	if !b.Fits(s.count, s.maxL, s.sumP) {
		return 0, false
	}
	return st.price(s, Features{}), true
}

// sortDesc sorts v descending in place and returns it.
func sortDesc(v []float64) []float64 {
	slices.SortFunc(v, func(x, y float64) int {
		switch {
		case x > y:
			return -1
		case x < y:
			return 1
		}
		return 0
	})
	return v
}
