package balancer

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// ErrReplan reports a suffix that cannot be replanned in place: the new plan
// would have another number of steps (global-token batches) or would drop or
// reject items.
var ErrReplan = errors.New("suffix cannot be replanned in place")

// Replan returns a plan whose steps before step from are p's and whose steps
// from it on are a new plan of the same real samples (in item order) under
// model, with p's configuration otherwise: the suffix re-planning after a
// recalibration. The result has as many steps as p, indexed the same way;
// padding entries of the suffix are rebuilt. p is not changed. It fails with
// ErrReplan when the new suffix would have another step count or would drop
// or reject items, and with the model's validation error for a bad model.
func (p *Plan) Replan(from int, model CostModel) (*Plan, error) {
	if err := model.Validate(); err != nil {
		return nil, err
	}
	at, _ := slices.BinarySearchFunc(p.Steps, from, func(s Step, t int) int { return cmp.Compare(s.Index, t) })
	if at >= len(p.Steps) {
		return nil, fmt.Errorf("balancer: replan from step %d of %d: %w", from, len(p.Steps), ErrReplan)
	}
	idx, items := p.liveItemsFrom(at)
	c := p.Config
	c.Model = model
	np, err := Build(items, c)
	if err != nil {
		return nil, fmt.Errorf("balancer: replan from step %d: %w", from, err)
	}
	if len(np.Steps) != len(p.Steps)-at || len(np.Dropped) > 0 || len(np.Rejected) > 0 {
		return nil, fmt.Errorf("balancer: replan from step %d: %d steps (want %d), %d dropped, %d rejected: %w",
			from, len(np.Steps), len(p.Steps)-at, len(np.Dropped), len(np.Rejected), ErrReplan)
	}
	q := *p
	q.Steps = append(slices.Clone(p.Steps[:at]), reindex(np.Steps, p.Steps[at].Index, idx)...)
	return &q, nil
}
