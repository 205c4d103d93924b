package balancer

import (
	"cmp"
	"fmt"
	"slices"
)

// Resize returns a plan whose steps before step from are p's and whose steps
// from it on are a new plan, for dp ranks, of the real samples p planned from
// step from on (in item order), with p's configuration otherwise (the same
// global batch): the rest of an epoch after a deliberate change of the world
// size. The new steps are numbered from on; their count may differ from p's.
// The result's Config.DP is dp, so its steps before from keep p's rank count
// and the later ones have dp ranks. p is not changed. Items the new plan
// drops (TailDrop) or rejects are added to the result's Dropped and
// Rejected.
func (p *Plan) Resize(from, dp int) (*Plan, error) {
	at, _ := slices.BinarySearchFunc(p.Steps, from, func(s Step, t int) int { return cmp.Compare(s.Index, t) })
	if at >= len(p.Steps) {
		return nil, fmt.Errorf("balancer: resize from step %d of %d: nothing left to plan: %w", from, len(p.Steps), ErrReplan)
	}
	c := p.Config
	c.DP = dp
	idx, items := p.liveItemsFrom(at)
	np, err := Build(items, c)
	if err != nil {
		return nil, fmt.Errorf("balancer: resize from step %d to dp %d: %w", from, dp, err)
	}
	q := *p
	q.Config = c
	q.Steps = append(slices.Clone(p.Steps[:at]), reindex(np.Steps, p.Steps[at].Index, idx)...)
	q.Dropped, q.Rejected = slices.Clone(p.Dropped), slices.Clone(p.Rejected)
	for _, d := range np.Dropped {
		q.Dropped = append(q.Dropped, idx[d])
	}
	for _, r := range np.Rejected {
		q.Rejected = append(q.Rejected, Rejection{Item: idx[r.Item], Reason: r.Reason})
	}
	return &q, nil
}

// liveItemsFrom returns the items of the real (weight > 0) entries of
// p.Steps[at:], sorted by item index, and their indexes in p's items.
func (p *Plan) liveItemsFrom(at int) ([]int32, []Item) {
	var idx []int32
	for _, s := range p.Steps[at:] {
		for _, rank := range s.Ranks {
			for _, mb := range rank {
				for _, e := range mb {
					if e.Weight > 0 {
						idx = append(idx, e.Item)
					}
				}
			}
		}
	}
	slices.Sort(idx)
	items := make([]Item, len(idx))
	for i, k := range idx {
		items[i] = p.items[k]
	}
	return idx, items
}

// reindex returns steps numbered from first whose entries refer to idx[item]
// instead of item (a plan of a subset back in its parent's item indexes).
func reindex(steps []Step, first int, idx []int32) []Step {
	out := make([]Step, 0, len(steps))
	for k, s := range steps {
		ns := Step{Index: first + k, Ranks: make([][]MicroBatch, len(s.Ranks))}
		for r, rank := range s.Ranks {
			ns.Ranks[r] = make([]MicroBatch, len(rank))
			for m, mb := range rank {
				mbOut := make(MicroBatch, len(mb))
				for i, e := range mb {
					e.Item = idx[e.Item]
					mbOut[i] = e
				}
				ns.Ranks[r][m] = mbOut
			}
		}
		out = append(out, ns)
	}
	return out
}
