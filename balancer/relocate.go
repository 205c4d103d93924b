package balancer

import (
	"cmp"
	"slices"
)

// relocation moves item from its group to group to.
type relocation struct {
	item int32
	to   int
}

// groupView is a group's statistics under hypothetical relocations. Removing
// members keeps maxL (an upper bound), so padding and budget estimates are
// conservative; apply recomputes them exactly.
type groupView struct {
	count, maxL, sumP int
}

func (p *Partitioner) view(g int) groupView {
	gr := &p.groups[g]
	return groupView{len(gr.members), gr.maxL, gr.sumP}
}

// viewSet holds the hypothetical views of the few groups an exchange
// touches (at most 2 × MicroBatches), looked up linearly.
type viewSet struct {
	keys []int
	vals []groupView
}

func (s *viewSet) get(g int) (groupView, bool) {
	for i, k := range s.keys {
		if k == g {
			return s.vals[i], true
		}
	}
	return groupView{}, false
}

func (s *viewSet) set(g int, v groupView) {
	for i, k := range s.keys {
		if k == g {
			s.vals[i] = v
			return
		}
	}
	s.keys = append(s.keys, g)
	s.vals = append(s.vals, v)
}

func (s *viewSet) clone() *viewSet {
	return &viewSet{keys: slices.Clone(s.keys), vals: slices.Clone(s.vals)}
}

func (v groupView) padded() int64 { return int64(v.count) * int64(v.maxL) }

// compound is a candidate multi-sample exchange between ranks a and b.
type compound struct {
	moves   []relocation
	score   float64
	padDiff int64
}

// bestCompound is the refinement's fallback when no single move or swap helps
// the most loaded rank a: with each lighter rank b, it tries
//
//   - a swap whose two samples may land in any micro-batch of the other rank
//     (not only each other's), choosing the placement that pads least; and
//   - an ejection: one sample of a goes to b and a greedy set of b's samples,
//     costliest first while they fit the wanted transfer, comes back to a,
//     each into the micro-batch where it pads least.
//
// Both keep micro-batches non-empty, within budget and the padding within
// p.cap. It returns the best by new pair maximum, then padding.
func (p *Partitioner) bestCompound(a, b int) (compound, bool) {
	var best compound
	ok := false
	consider := func(c compound) {
		if !ok || c.score < best.score || (c.score == best.score && c.padDiff < best.padDiff) {
			best, ok = c, true
		}
	}
	p.freeSwaps(a, b, consider)
	p.ejections(a, b, consider)
	return best, ok
}

// place returns the group of rank r (skipping none when skip < 0) that takes
// an item of length l and image tokens ip with the least padding increase
// within budget, and that increase; -1 when none fits.
func (p *Partitioner) place(r int, views *viewSet, l, ip int) (int, int64) {
	m := p.cfg.MicroBatches
	best, bestD := -1, int64(0)
	for g := r * m; g < (r+1)*m; g++ {
		v, ok := views.get(g)
		if !ok {
			v = p.view(g)
		}
		nm := max(v.maxL, l)
		if !p.cfg.Budget.Fits(v.count+1, nm, v.sumP+ip) {
			continue
		}
		d := int64(v.count+1)*int64(nm) - v.padded()
		if best < 0 || d < bestD {
			best, bestD = g, d
		}
	}
	return best, bestD
}

// take removes item i from its group in views and returns the padding change
// (removal keeps maxL unless the group's exact maximum drops, see groupView).
func (p *Partitioner) take(views *viewSet, i int32) (int64, bool) {
	g := int(p.itemG[i])
	v, ok := views.get(g)
	exact := !ok
	if !ok {
		v = p.view(g)
	}
	if v.count <= 1 {
		return 0, false
	}
	before := v.padded()
	v.count--
	v.sumP -= p.items[i].ImageTokens
	if exact {
		v.maxL = p.groups[g].maxWithout(p.items[i].TextTokens)
	}
	views.set(g, v)
	return v.padded() - before, true
}

// put adds item i to group g in views and returns the padding change.
func (p *Partitioner) put(views *viewSet, i int32, g int) int64 {
	v, ok := views.get(g)
	if !ok {
		v = p.view(g)
	}
	before := v.padded()
	v.count++
	v.maxL = max(v.maxL, p.items[i].TextTokens)
	v.sumP += p.items[i].ImageTokens
	views.set(g, v)
	return v.padded() - before
}

// freeSwaps offers swaps of x (rank a) and y (rank b), each into the best
// micro-batch of its new rank.
func (p *Partitioner) freeSwaps(a, b int, consider func(compound)) {
	m := p.cfg.MicroBatches
	pl := p.cfg.Placement
	bar := p.step[a] * (1 - minGain)
	for g := a * m; g < (a+1)*m; g++ {
		for _, x := range p.groups[g].members {
			cx := p.costs[x]
			restA := p.rank[a].Sub(cx)
			for h := b * m; h < (b+1)*m; h++ {
				for _, y := range p.groups[h].members {
					cy := p.costs[y]
					score := max(pl.StepCost(restA.Add(cy)), pl.StepCost(p.rank[b].Sub(cy).Add(cx)))
					if score >= bar {
						continue
					}
					views := &viewSet{}
					var d int64
					// Swap in place first: both leave, then each joins its best group.
					dx, okx := p.swapOut(views, x)
					dy, oky := p.swapOut(views, y)
					if !okx || !oky {
						continue
					}
					gy, py := p.place(a, views, p.items[y].TextTokens, p.items[y].ImageTokens)
					if gy < 0 {
						continue
					}
					py = p.put(views, y, gy)
					gx, _ := p.place(b, views, p.items[x].TextTokens, p.items[x].ImageTokens)
					if gx < 0 {
						continue
					}
					px := p.put(views, x, gx)
					d = dx + dy + py + px
					if !p.groupsNonEmpty(views) || (d > 0 && p.padded+d > p.cap) {
						continue
					}
					consider(compound{moves: []relocation{{x, gx}, {y, gy}}, score: score, padDiff: d})
				}
			}
		}
	}
}

// swapOut removes i from its group allowing the group to become empty for
// the moment (the swap refills it or groupsNonEmpty rejects the result).
func (p *Partitioner) swapOut(views *viewSet, i int32) (int64, bool) {
	g := int(p.itemG[i])
	v, ok := views.get(g)
	exact := !ok
	if !ok {
		v = p.view(g)
	}
	before := v.padded()
	v.count--
	v.sumP -= p.items[i].ImageTokens
	if exact {
		v.maxL = p.groups[g].maxWithout(p.items[i].TextTokens)
	}
	if v.count == 0 {
		v.maxL = 0
	}
	views.set(g, v)
	return v.padded() - before, true
}

func (p *Partitioner) groupsNonEmpty(views *viewSet) bool {
	for _, v := range views.vals {
		if v.count < 1 {
			return false
		}
	}
	return true
}

// ejections offers x (rank a) to rank b with a greedy set of b's samples back.
func (p *Partitioner) ejections(a, b int, consider func(compound)) {
	m := p.cfg.MicroBatches
	pl := p.cfg.Placement
	bar := p.step[a] * (1 - minGain)
	var backs []int32
	for h := b * m; h < (b+1)*m; h++ {
		backs = append(backs, p.groups[h].members...)
	}
	slices.SortFunc(backs, func(x, y int32) int {
		if c := cmp.Compare(p.costs[y].Total(), p.costs[x].Total()); c != 0 {
			return c
		}
		return cmp.Compare(x, y)
	})
	gap := p.rank[a].Total() - p.rank[b].Total()
	for g := a * m; g < (a+1)*m; g++ {
		for _, x := range p.groups[g].members {
			cx := p.costs[x]
			want := cx.Total() - gap/2 // bring back this much to even the pair
			if want <= 0 {
				continue // a plain move does it
			}
			views := &viewSet{}
			d, ok := p.take(views, x)
			if !ok {
				continue
			}
			gx, _ := p.place(b, views, p.items[x].TextTokens, p.items[x].ImageTokens)
			if gx < 0 {
				continue
			}
			d += p.put(views, x, gx)
			moves := []relocation{{x, gx}}
			na, nb := p.rank[a].Sub(cx), p.rank[b].Add(cx)
			left := want
			for _, y := range backs {
				cy := p.costs[y].Total()
				if cy > left {
					continue
				}
				trial := views.clone()
				dy, ok := p.take(trial, y)
				if !ok {
					continue
				}
				gy, _ := p.place(a, trial, p.items[y].TextTokens, p.items[y].ImageTokens)
				if gy < 0 {
					continue
				}
				dy += p.put(trial, y, gy)
				if d+dy > 0 && p.padded+d+dy > p.cap {
					continue
				}
				views, d = trial, d+dy
				moves = append(moves, relocation{y, gy})
				na, nb = na.Add(p.costs[y]), nb.Sub(p.costs[y])
				if left -= cy; left <= 0 {
					break
				}
			}
			if len(moves) < 2 {
				continue // a single move is bestExchange's
			}
			if score := max(pl.StepCost(na), pl.StepCost(nb)); score < bar {
				consider(compound{moves: moves, score: score, padDiff: d})
			}
		}
	}
}

// applyCompound performs the relocations and recomputes the touched groups,
// rank costs and the padding exactly.
func (p *Partitioner) applyCompound(c compound) {
	touched := map[int]bool{}
	for _, mv := range c.moves {
		touched[int(p.itemG[mv.item])] = true
		touched[mv.to] = true
	}
	gs := make([]int, 0, len(touched))
	for g := range touched {
		gs = append(gs, g)
	}
	slices.Sort(gs)
	for _, g := range gs {
		p.padded -= p.groups[g].padded()
	}
	for _, mv := range c.moves {
		from := int(p.itemG[mv.item])
		gm := p.groups[from].members
		si := p.slot[mv.item]
		last := gm[len(gm)-1]
		gm[si] = last
		p.slot[last] = si
		p.groups[from].members = gm[:len(gm)-1]
		p.slot[mv.item] = int32(len(p.groups[mv.to].members))
		p.groups[mv.to].members = append(p.groups[mv.to].members, mv.item)
		p.itemG[mv.item] = int32(mv.to)
		m := p.cfg.MicroBatches
		ra, rb := from/m, mv.to/m
		p.rank[ra] = p.rank[ra].Sub(p.costs[mv.item])
		p.rank[rb] = p.rank[rb].Add(p.costs[mv.item])
	}
	for _, g := range gs {
		p.refresh(g)
		p.padded += p.groups[g].padded()
	}
	pl := p.cfg.Placement
	for r := range p.rank {
		p.step[r] = pl.StepCost(p.rank[r])
	}
}
