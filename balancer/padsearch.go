package balancer

import (
	"cmp"
	"slices"
)

func (jb *job) meanStep(sc *padScratch) float64 {
	var s float64
	for _, c := range sc.step {
		s += c
	}
	return s / float64(len(sc.step))
}

// exchange is a candidate refinement step from the most loaded rank a: move
// the member at index xi of group g to group h, and when xj ≥ 0 move h's
// member at index xj back to g (a swap). g and h may both be a's.
type exchange struct {
	g, h, xi, xj int
	score        float64 // the larger new step cost of the ranks involved
	total        float64 // their new summed step cost (less padding first)
	ok           bool
}

// better orders candidates: lower new maximum, then lower total, then the
// earlier indices (determinism).
func (e exchange) better(o exchange) bool {
	if !o.ok {
		return true
	}
	if e.score != o.score {
		return e.score < o.score
	}
	if e.total != o.total {
		return e.total < o.total
	}
	return cmp.Or(cmp.Compare(e.g, o.g), cmp.Compare(e.h, o.h), cmp.Compare(e.xi, o.xi), cmp.Compare(e.xj, o.xj)) < 0
}

// shape is a group's padded shape under a hypothetical change.
func (g *group) shape() mbShape {
	return mbShape{count: len(g.members), maxL: g.maxL, maxP: g.maxP, complexity: g.cplx, sumP: g.sumP}
}

// without returns g's shape after removing it.
func (g *group) without(it Item) mbShape {
	return mbShape{count: len(g.members) - 1, maxL: g.maxWithout(it.TextTokens), maxP: g.maxPWithout(it.ImageTokens),
		complexity: g.cplx - it.Complexity, sumP: g.sumP - it.ImageTokens}
}

// padSearch repeatedly takes the most loaded rank (padded cost) and applies
// the best move or swap of one sample between two of its micro-batches or
// with a micro-batch of a lighter rank that lowers the ranks' maximum, keeping
// every micro-batch non-empty and within budget.
func (jb *job) padSearch(sc *padScratch) {
	dp := jb.cfg.DP
	limit := jb.cfg.MaxMoves
	if limit == 0 {
		limit = movesPerItem * len(jb.items)
	}
	ranks := make([]int32, dp)
	evals := 0
	budget := min(padSearchEvals, evalsPerItem*len(jb.items))
	for moves := 0; moves < limit && evals < budget; moves++ {
		for r := range ranks {
			ranks[r] = int32(r)
		}
		slices.SortFunc(ranks, func(x, y int32) int {
			return cmp.Or(cmp.Compare(sc.step[x], sc.step[y]), cmp.Compare(x, y))
		})
		a := int(ranks[dp-1])
		if sc.step[a] <= (1+settledImbalance)*jb.meanStep(sc) {
			return
		}
		e := jb.bestPadExchange(sc, a, a, true, &evals)
		for k, b := range ranks[:min(dp-1, maxPartners)] {
			if sc.step[b] >= sc.step[a]*(1-minGain) {
				break
			}
			if o := jb.bestPadExchange(sc, a, int(b), k < maxSwapPartners, &evals); o.ok && o.better(e) {
				e = o
				break
			}
		}
		if !e.ok {
			return
		}
		jb.applyPad(sc, a, e)
	}
}

// bestPadExchange returns the best improving move or swap between the groups
// of rank a and those of rank b (b == a: within a), counting the exchanges it
// evaluates in evals.
func (jb *job) bestPadExchange(sc *padScratch, a, b int, swaps bool, evals *int) exchange {
	ps := jb.newPadSearch(sc, a, b, evals)
	m := jb.cfg.MicroBatches
	for g := a * m; g < (a+1)*m; g++ {
		gg := &sc.groups[g]
		for xi, i := range gg.members {
			it := jb.items[i]
			gw := gg.without(it)
			for h := b * m; h < (b+1)*m; h++ {
				if h == g {
					continue
				}
				pr := ps.pair(g, h, xi, it, gw)
				ps.tryMove(&pr)
				if swaps {
					ps.trySwaps(&pr)
				}
			}
		}
	}
	return ps.best
}

// padSearch is one bestPadExchange: the two ranks, the bars an exchange must
// pass and the best exchange so far.
type padSearch struct {
	jb      *job
	sc      *padScratch
	a, b    int
	pl      Placement
	bud     Budget
	limited bool
	bar     float64
	// An exchange that keeps the pair's maximum but lowers its total (less
	// padding computed) is taken too: padding is the secondary objective.
	totalBar float64
	evals    *int
	best     exchange
}

func (jb *job) newPadSearch(sc *padScratch, a, b int, evals *int) padSearch {
	ps := padSearch{jb: jb, sc: sc, a: a, b: b, pl: jb.cfg.Placement, bud: jb.cfg.Budget, evals: evals}
	ps.limited = !ps.bud.Unlimited()
	ps.bar = sc.step[a] * (1 - minGain)
	ps.totalBar = sc.step[a] * (1 - minGain)
	if a != b {
		ps.totalBar = (sc.step[a] + sc.step[b]) * (1 - minGain)
	}
	return ps
}

// padPair is member xi (item it) of group g, to move to or swap with a
// member of group h: gw is g without it, base and other the costs of ranks
// a and b without g and h.
type padPair struct {
	g, h, xi    int
	gg, hh      *group
	it          Item
	gw          mbShape
	base, other Cost
}

func (ps *padSearch) pair(g, h, xi int, it Item, gw mbShape) padPair {
	pr := padPair{g: g, h: h, xi: xi, gg: &ps.sc.groups[g], hh: &ps.sc.groups[h], it: it, gw: gw}
	pr.base = ps.sc.rank[ps.a].Sub(pr.gg.cost)
	pr.other = ps.sc.rank[ps.b].Sub(pr.hh.cost)
	if ps.a == ps.b {
		pr.base = pr.base.Sub(pr.hh.cost)
	}
	return pr
}

// first prices g's side (rank a) after the exchange; it reports false when
// the exchange cannot win (a gets heavier than it is, or than best).
func (ps *padSearch) first(pr *padPair, ng mbShape) (Cost, float64, bool) {
	*ps.evals++
	cg := ps.jb.padCost(ng)
	if ps.a == ps.b {
		return cg, 0, true
	}
	na := ps.pl.StepCost(pr.base.Add(cg))
	return cg, na, !(na > ps.sc.step[ps.a] || (ps.best.ok && na > ps.best.score))
}

// second prices h's side and keeps the exchange if it is the best.
func (ps *padSearch) second(pr *padPair, cg Cost, na float64, nh mbShape, xj int) {
	var score, total float64
	if ps.a == ps.b {
		score = ps.pl.StepCost(pr.base.Add(cg).Add(ps.jb.padCost(nh)))
		total = score
	} else {
		nb := ps.pl.StepCost(pr.other.Add(ps.jb.padCost(nh)))
		score, total = max(na, nb), na+nb
	}
	if score >= ps.bar && (score > ps.sc.step[ps.a] || total >= ps.totalBar) {
		return
	}
	if e := (exchange{g: pr.g, h: pr.h, xi: pr.xi, xj: xj, score: score, total: total, ok: true}); e.better(ps.best) {
		ps.best = e
	}
}

// tryMove prices moving it from g to h.
func (ps *padSearch) tryMove(pr *padPair) {
	if len(pr.gg.members) <= 1 {
		return
	}
	nh := pr.hh.shape().with(pr.it)
	if ps.bud.Fits(pr.gw.count, pr.gw.maxL, pr.gw.sumP) && ps.bud.Fits(nh.count, nh.maxL, nh.sumP) {
		if cg, na, ok := ps.first(pr, pr.gw); ok {
			ps.second(pr, cg, na, nh, -1)
		}
	}
}

// trySwaps prices swapping it with each member of h.
func (ps *padSearch) trySwaps(pr *padPair) {
	jb, gw, hh, it := ps.jb, pr.gw, pr.hh, pr.it
	countOnly := ps.swapsCountOnly(pr)
	// With a cost blind to complexity (jb.shapePriced) a swap is
	// priced by the new groups' longest L and largest P alone: a
	// swap that leaves them as the previous one did scores the
	// same, and loses the tie to it (the earlier index), so it is
	// counted but not priced again.
	var prev [4]int
	priced := false
	for xj, j := range hh.members {
		jt := &jb.items[j]
		if jt.TextTokens >= it.TextTokens && jt.ImageTokens >= it.ImageTokens && jt.Complexity >= it.Complexity &&
			(ps.a != ps.b || *jt == it) {
			continue // j costs a at least what i did (padded costs grow with L, P, complexity)
		}
		// The new groups' longest L and their budget fields,
		// before their shapes are built.
		ngL, nhL := max(gw.maxL, jt.TextTokens), max(hh.maxWithout(jt.TextTokens), it.TextTokens)
		if ps.limited && (!ps.bud.Fits(gw.count+1, ngL, gw.sumP+jt.ImageTokens) || !ps.bud.Fits(len(hh.members), nhL, hh.sumP-jt.ImageTokens+it.ImageTokens)) {
			continue
		}
		if countOnly {
			*ps.evals++
			continue
		}
		ngP, nhP := max(gw.maxP, jt.ImageTokens), max(hh.maxPWithout(jt.ImageTokens), it.ImageTokens)
		if jb.shapePriced {
			key := [4]int{ngL, ngP, nhL, nhP}
			if priced && key == prev {
				*ps.evals++
				continue
			}
			prev, priced = key, true
		}
		if cg, na, ok := ps.first(pr, gw.with(*jt)); ok {
			ps.second(pr, cg, na, hh.without(*jt).with(it), xj)
		}
	}
}

// swapsCountOnly: when a group's cost cannot fall as its maxima grow
// (jb.growingCost), no swap leaves g cheaper than g without i at its old
// count: if that already makes rank a heavier than it is or than best,
// first refuses every swap with h, which are then only counted.
func (ps *padSearch) swapsCountOnly(pr *padPair) bool {
	if ps.a == ps.b || !ps.jb.growingCost {
		return false
	}
	floor := ps.pl.StepCost(pr.base.Add(ps.jb.padCost(mbShape{count: len(pr.gg.members), maxL: pr.gw.maxL, maxP: pr.gw.maxP})))
	return floor > ps.sc.step[ps.a] || (ps.best.ok && floor > ps.best.score)
}

// with returns s after adding it.
func (s mbShape) with(it Item) mbShape {
	s.count++
	s.maxL = max(s.maxL, it.TextTokens)
	s.maxP = max(s.maxP, it.ImageTokens)
	s.complexity += it.Complexity
	s.sumP += it.ImageTokens
	return s
}

// applyPad performs exchange e and recomputes the touched groups and ranks.
func (jb *job) applyPad(sc *padScratch, a int, e exchange) {
	m := jb.cfg.MicroBatches
	g, h := &sc.groups[e.g], &sc.groups[e.h]
	i := g.members[e.xi]
	if e.xj >= 0 {
		g.members[e.xi], h.members[e.xj] = h.members[e.xj], i
	} else {
		g.members = slices.Delete(g.members, e.xi, e.xi+1)
		h.members = append(h.members, i)
	}
	jb.refresh(sc, e.g)
	jb.refresh(sc, e.h)
	jb.rankCost(sc, a)
	if b := e.h / m; b != a {
		jb.rankCost(sc, b)
	}
}

// rankCost recomputes rank r's cost and step cost from its groups.
func (jb *job) rankCost(sc *padScratch, r int) {
	m := jb.cfg.MicroBatches
	var c Cost
	for g := r * m; g < (r+1)*m; g++ {
		c = c.Add(sc.groups[g].cost)
	}
	sc.rank[r] = c
	sc.step[r] = jb.cfg.Placement.StepCost(c)
}
