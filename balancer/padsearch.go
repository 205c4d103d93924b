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
	m := jb.cfg.MicroBatches
	pl := jb.cfg.Placement
	bud := jb.cfg.Budget
	limited := !bud.Unlimited()
	bar := sc.step[a] * (1 - minGain)
	// An exchange that keeps the pair's maximum but lowers its total (less
	// padding computed) is taken too: padding is the secondary objective.
	totalBar := sc.step[a] * (1 - minGain)
	if a != b {
		totalBar = (sc.step[a] + sc.step[b]) * (1 - minGain)
	}
	var best exchange
	for g := a * m; g < (a+1)*m; g++ {
		gg := &sc.groups[g]
		for xi, i := range gg.members {
			it := jb.items[i]
			gw := gg.without(it)
			for h := b * m; h < (b+1)*m; h++ {
				if h == g {
					continue
				}
				hh := &sc.groups[h]
				base := sc.rank[a].Sub(gg.cost)
				other := sc.rank[b].Sub(hh.cost)
				if a == b {
					base = base.Sub(hh.cost)
				}
				// first prices g's side (rank a) after the exchange; it
				// reports false when the exchange cannot win (a gets heavier
				// than it is, or than best).
				first := func(ng mbShape) (Cost, float64, bool) {
					*evals++
					cg := jb.padCost(ng)
					if a == b {
						return cg, 0, true
					}
					na := pl.StepCost(base.Add(cg))
					return cg, na, !(na > sc.step[a] || (best.ok && na > best.score))
				}
				// second prices h's side and keeps the exchange if it is the best.
				second := func(cg Cost, na float64, nh mbShape, xj int) {
					var score, total float64
					if a == b {
						score = pl.StepCost(base.Add(cg).Add(jb.padCost(nh)))
						total = score
					} else {
						nb := pl.StepCost(other.Add(jb.padCost(nh)))
						score, total = max(na, nb), na+nb
					}
					if score >= bar && (score > sc.step[a] || total >= totalBar) {
						return
					}
					if e := (exchange{g: g, h: h, xi: xi, xj: xj, score: score, total: total, ok: true}); e.better(best) {
						best = e
					}
				}
				if len(gg.members) > 1 {
					nh := hh.shape().with(it)
					if bud.Fits(gw.count, gw.maxL, gw.sumP) && bud.Fits(nh.count, nh.maxL, nh.sumP) {
						if cg, na, ok := first(gw); ok {
							second(cg, na, nh, -1)
						}
					}
				}
				if !swaps {
					continue
				}
				// When a group's cost cannot fall as its maxima grow
				// (jb.growingCost), no swap leaves g cheaper than g without i
				// at its old count: if that already makes rank a heavier than
				// it is or than best, first refuses every swap with h, which
				// are then only counted.
				countOnly := false
				if a != b && jb.growingCost {
					floor := pl.StepCost(base.Add(jb.padCost(mbShape{count: len(gg.members), maxL: gw.maxL, maxP: gw.maxP})))
					countOnly = floor > sc.step[a] || (best.ok && floor > best.score)
				}
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
						(a != b || *jt == it) {
						continue // j costs a at least what i did (padded costs grow with L, P, complexity)
					}
					// The new groups' longest L and their budget fields,
					// before their shapes are built.
					ngL, nhL := max(gw.maxL, jt.TextTokens), max(hh.maxWithout(jt.TextTokens), it.TextTokens)
					if limited && (!bud.Fits(gw.count+1, ngL, gw.sumP+jt.ImageTokens) || !bud.Fits(len(hh.members), nhL, hh.sumP-jt.ImageTokens+it.ImageTokens)) {
						continue
					}
					if countOnly {
						*evals++
						continue
					}
					ngP, nhP := max(gw.maxP, jt.ImageTokens), max(hh.maxPWithout(jt.ImageTokens), it.ImageTokens)
					if jb.shapePriced {
						key := [4]int{ngL, ngP, nhL, nhP}
						if priced && key == prev {
							*evals++
							continue
						}
						prev, priced = key, true
					}
					if cg, na, ok := first(gw.with(*jt)); ok {
						second(cg, na, hh.without(*jt).with(it), xj)
					}
				}
			}
		}
	}
	return best
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
