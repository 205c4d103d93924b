package balancer

import (
	"cmp"
	"slices"
)

// minGain is the relative improvement below which a move is not worth making.
const minGain = 1e-7

// maxPartners bounds how many of the lightest ranks the refinement tries per
// step before it stops: when the lightest ranks cannot take work from the
// heaviest, heavier ones rarely can.
const maxPartners = 16

// maxSwapPartners bounds the partners the refinement tries swaps with (a swap
// looks at every pair of samples of the two ranks).
const maxSwapPartners = 4

// padSearchEvals bounds the exchanges one padSearch evaluates (about 40 ns
// each), so that a partition takes milliseconds however large the batch; the
// count, not the clock, stops it, so the result stays deterministic. The
// bound is evalsPerItem per item, at most padSearchEvals.
const (
	padSearchEvals = 1 << 15
	evalsPerItem   = 128
)

// settledImbalance is the max / mean − 1 at which padSearch stops: closer
// to even is noise next to the cost model's error.
const settledImbalance = 5e-4

func (p *Partitioner) meanStep() float64 {
	var s float64
	for _, c := range p.step {
		s += c
	}
	return s / float64(len(p.step))
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
func (p *Partitioner) padSearch() {
	dp := p.cfg.DP
	limit := p.cfg.MaxMoves
	if limit == 0 {
		limit = 8 * len(p.items)
	}
	ranks := make([]int32, dp)
	p.evals = 0
	budget := min(padSearchEvals, evalsPerItem*len(p.items))
	for moves := 0; moves < limit && p.evals < budget; moves++ {
		for r := range ranks {
			ranks[r] = int32(r)
		}
		slices.SortFunc(ranks, func(x, y int32) int {
			return cmp.Or(cmp.Compare(p.step[x], p.step[y]), cmp.Compare(x, y))
		})
		a := int(ranks[dp-1])
		if p.step[a] <= (1+settledImbalance)*p.meanStep() {
			return
		}
		e := p.bestPadExchange(a, a, true)
		for k, b := range ranks[:min(dp-1, maxPartners)] {
			if p.step[b] >= p.step[a]*(1-minGain) {
				break
			}
			if o := p.bestPadExchange(a, int(b), k < maxSwapPartners); o.ok && o.better(e) {
				e = o
				break
			}
		}
		if !e.ok {
			return
		}
		p.applyPad(a, e)
	}
}

// bestPadExchange returns the best improving move or swap between the groups
// of rank a and those of rank b (b == a: within a).
func (p *Partitioner) bestPadExchange(a, b int, swaps bool) exchange {
	m := p.cfg.MicroBatches
	pl := p.cfg.Placement
	bud := p.cfg.Budget
	bar := p.step[a] * (1 - minGain)
	// An exchange that keeps the pair's maximum but lowers its total (less
	// padding computed) is taken too: padding is the secondary objective.
	totalBar := p.step[a] * (1 - minGain)
	if a != b {
		totalBar = (p.step[a] + p.step[b]) * (1 - minGain)
	}
	var best exchange
	cost := p.padCost
	for g := a * m; g < (a+1)*m; g++ {
		gg := &p.groups[g]
		for xi, i := range gg.members {
			it := p.items[i]
			gw := gg.without(it)
			for h := b * m; h < (b+1)*m; h++ {
				if h == g {
					continue
				}
				hh := &p.groups[h]
				base := p.rank[a].Sub(gg.cost)
				other := p.rank[b].Sub(hh.cost)
				if a == b {
					base = base.Sub(hh.cost)
				}
				eval := func(ng, nh mbShape, xj int) {
					if !bud.Fits(ng.count, ng.maxL, ng.sumP) || !bud.Fits(nh.count, nh.maxL, nh.sumP) {
						return
					}
					p.evals++
					cg := cost(ng)
					var score, total float64
					if a == b {
						score = pl.StepCost(base.Add(cg).Add(cost(nh)))
						total = score
					} else {
						na := pl.StepCost(base.Add(cg))
						if na > p.step[a] || (best.ok && na > best.score) {
							return // a gets heavier, or cannot beat best
						}
						nb := pl.StepCost(other.Add(cost(nh)))
						score, total = max(na, nb), na+nb
					}
					if score >= bar && (score > p.step[a] || total >= totalBar) {
						return
					}
					if e := (exchange{g: g, h: h, xi: xi, xj: xj, score: score, total: total, ok: true}); e.better(best) {
						best = e
					}
				}
				if len(gg.members) > 1 {
					eval(gw, hh.shape().with(it), -1)
				}
				if !swaps {
					continue
				}
				for xj, j := range hh.members {
					jt := p.items[j]
					if jt.TextTokens >= it.TextTokens && jt.ImageTokens >= it.ImageTokens && jt.Complexity >= it.Complexity &&
						(a != b || jt == it) {
						continue // j costs a at least what i did (padded costs grow with L, P, complexity)
					}
					eval(gw.with(jt), hh.without(jt).with(it), xj)
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
func (p *Partitioner) applyPad(a int, e exchange) {
	m := p.cfg.MicroBatches
	g, h := &p.groups[e.g], &p.groups[e.h]
	i := g.members[e.xi]
	if e.xj >= 0 {
		g.members[e.xi], h.members[e.xj] = h.members[e.xj], i
	} else {
		g.members = slices.Delete(g.members, e.xi, e.xi+1)
		h.members = append(h.members, i)
	}
	p.refresh(e.g)
	p.refresh(e.h)
	p.rankCost(a)
	if b := e.h / m; b != a {
		p.rankCost(b)
	}
}

// rankCost recomputes rank r's cost and step cost from its groups.
func (p *Partitioner) rankCost(r int) {
	m := p.cfg.MicroBatches
	var c Cost
	for g := r * m; g < (r+1)*m; g++ {
		c = c.Add(p.groups[g].cost)
	}
	p.rank[r] = c
	p.step[r] = p.cfg.Placement.StepCost(c)
}
