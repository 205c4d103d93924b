package balancer

import (
	"cmp"
	"slices"
)

// exchange is a candidate refinement step between the most loaded rank a and a
// lighter rank b: move item i from group g to group h, and when j ≥ 0 move j
// from h back to g (a swap).
type exchange struct {
	i, j    int32
	g, h    int
	score   float64 // max of the two new rank costs
	padDiff int64
	ok      bool
}

// better orders candidates: lower new maximum, then less padding, then the
// earlier positions (determinism).
func (e exchange) better(o exchange) bool {
	if !o.ok {
		return true
	}
	if e.score != o.score {
		return e.score < o.score
	}
	if e.padDiff != o.padDiff {
		return e.padDiff < o.padDiff
	}
	if e.i != o.i {
		return e.i < o.i
	}
	return e.j < o.j
}

// minGain is the relative improvement below which a move is not worth making.
const minGain = 1e-7

// maxPartners bounds how many of the lightest ranks the refinement tries per
// step before it stops: when the lightest ranks cannot take work from the
// heaviest, heavier ones rarely can.
const maxPartners = 16

// localSearch repeatedly takes the most loaded rank and applies the best move
// or swap with the lightest rank that lowers the pair's maximum, keeping every
// micro-batch non-empty, within budget, and the padding within p.cap.
func (p *Partitioner) localSearch() {
	dp := p.cfg.DP
	if dp < 2 {
		return
	}
	limit := p.cfg.MaxMoves
	if limit == 0 {
		limit = 8 * len(p.items)
	}
	ranks := make([]int32, dp)
	for moves := 0; moves < limit; moves++ {
		for r := range ranks {
			ranks[r] = int32(r)
		}
		slices.SortFunc(ranks, func(x, y int32) int {
			if c := cmp.Compare(p.step[x], p.step[y]); c != 0 {
				return c
			}
			return cmp.Compare(x, y)
		})
		a := int(ranks[dp-1])
		applied := false
		for _, b := range ranks[:min(dp-1, maxPartners)] {
			if p.step[b] >= p.step[a]*(1-minGain) {
				break
			}
			if e := p.bestExchange(a, int(b)); e.ok {
				p.apply(a, int(b), e)
				applied = true
				break
			}
		}
		if !applied && p.step[a] > (1+compoundImbalance)*p.meanStep() {
			applied = p.tryCompound(a, ranks[:min(dp-1, maxCompoundPartners)])
		}
		if !applied {
			return
		}
	}
}

// compoundImbalance is the max / mean − 1 above which the refinement, when no
// single move or swap helps, tries compound exchanges (bestCompound). Below
// it the gain is not worth their cost.
const compoundImbalance = 2e-3

// maxCompoundPartners bounds how many of the lightest ranks the compound
// exchanges are tried with.
const maxCompoundPartners = 4

func (p *Partitioner) meanStep() float64 {
	var s float64
	for _, c := range p.step {
		s += c
	}
	return s / float64(len(p.step))
}

// tryCompound applies the best compound exchange of rank a with the first of
// partners (lightest first) that has one.
func (p *Partitioner) tryCompound(a int, partners []int32) bool {
	for _, b := range partners {
		if p.step[b] >= p.step[a]*(1-minGain) {
			return false
		}
		if c, ok := p.bestCompound(a, int(b)); ok {
			p.applyCompound(c)
			return true
		}
	}
	return false
}

// bestExchange returns the best improving move or swap from rank a to rank b.
func (p *Partitioner) bestExchange(a, b int) exchange {
	m := p.cfg.MicroBatches
	pl := p.cfg.Placement
	bud := p.cfg.Budget
	bar := p.step[a] * (1 - minGain)
	var best exchange
	colocated := pl == Colocated
	gap := p.step[a] - p.step[b]
	for g := a * m; g < (a+1)*m; g++ {
		gg := &p.groups[g]
		for _, i := range gg.members {
			it, ci := p.items[i], p.costs[i]
			ti := ci.Total()
			restA := p.rank[a].Sub(ci)
			gMax := gg.maxWithout(it.TextTokens)
			// Move i to a group of b.
			if len(gg.members) > 1 {
				na, nb := pl.StepCost(restA), pl.StepCost(p.rank[b].Add(ci))
				if score := max(na, nb); score < bar {
					for h := b * m; h < (b+1)*m; h++ {
						hh := &p.groups[h]
						hMax := max(hh.maxL, it.TextTokens)
						if !bud.Fits(len(hh.members)+1, hMax, hh.sumP+it.ImageTokens) {
							continue
						}
						d := int64(len(gg.members)-1)*int64(gMax) - gg.padded() +
							int64(len(hh.members)+1)*int64(hMax) - hh.padded()
						if p.padded+d > p.cap && d > 0 {
							continue
						}
						e := exchange{i: i, j: -1, g: g, h: h, score: score, padDiff: d, ok: true}
						if e.better(best) {
							best = e
						}
					}
				}
			}
			// Swap i with j of b.
			for h := b * m; h < (b+1)*m; h++ {
				hh := &p.groups[h]
				for _, j := range hh.members {
					cj := p.costs[j]
					if colocated {
						if d := ti - cj.Total(); d <= 0 || d >= gap {
							continue
						}
					} else if cj.Vision >= ci.Vision && cj.Text >= ci.Text && cj.Fusion >= ci.Fusion {
						continue // a never gets cheaper
					}
					jt := p.items[j]
					na := pl.StepCost(restA.Add(cj))
					nb := pl.StepCost(p.rank[b].Sub(cj).Add(ci))
					score := max(na, nb)
					if score >= bar || (best.ok && score > best.score) {
						continue
					}
					ng := max(gMax, jt.TextTokens)
					nh := max(hh.maxWithout(jt.TextTokens), it.TextTokens)
					if !bud.Fits(len(gg.members), ng, gg.sumP-it.ImageTokens+jt.ImageTokens) ||
						!bud.Fits(len(hh.members), nh, hh.sumP-jt.ImageTokens+it.ImageTokens) {
						continue
					}
					d := int64(len(gg.members))*int64(ng) - gg.padded() +
						int64(len(hh.members))*int64(nh) - hh.padded()
					if p.padded+d > p.cap && d > 0 {
						continue
					}
					e := exchange{i: i, j: j, g: g, h: h, score: score, padDiff: d, ok: true}
					if e.better(best) {
						best = e
					}
				}
			}
		}
	}
	return best
}

// apply performs exchange e between ranks a and b.
func (p *Partitioner) apply(a, b int, e exchange) {
	ci := p.costs[e.i]
	p.padded += e.padDiff
	p.rank[a] = p.rank[a].Sub(ci)
	p.rank[b] = p.rank[b].Add(ci)
	if e.j >= 0 {
		cj := p.costs[e.j]
		p.rank[a] = p.rank[a].Add(cj)
		p.rank[b] = p.rank[b].Sub(cj)
		si, sj := p.slot[e.i], p.slot[e.j]
		p.groups[e.g].members[si] = e.j
		p.groups[e.h].members[sj] = e.i
		p.slot[e.i], p.slot[e.j] = sj, si
		p.itemG[e.i], p.itemG[e.j] = int32(e.h), int32(e.g)
	} else {
		gm := p.groups[e.g].members
		si := p.slot[e.i]
		last := gm[len(gm)-1]
		gm[si] = last
		p.slot[last] = si
		p.groups[e.g].members = gm[:len(gm)-1]
		p.slot[e.i] = int32(len(p.groups[e.h].members))
		p.groups[e.h].members = append(p.groups[e.h].members, e.i)
		p.itemG[e.i] = int32(e.h)
	}
	p.refresh(e.g)
	p.refresh(e.h)
	pl := p.cfg.Placement
	p.step[a], p.step[b] = pl.StepCost(p.rank[a]), pl.StepCost(p.rank[b])
}
