package produce

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
)

// runEpochRemote is runEpoch for the planner role: the steps' rows are built
// by workers. It issues the items of the next WorkAhead steps ahead of the
// one it queues, and queues each rank's payloads in plan order as the
// workers deliver them, whatever order they finish in.
func (p *Producer) runEpochRemote(ctx, gctx context.Context, e, from int, next []proto.Pos, queues []chan deliver.Out) error {
	ep, err := p.epochs.Epoch(gctx, e)
	if err != nil {
		return err
	}
	if from >= ep.Info().Steps {
		return nil
	}
	defer p.work.LogTally(e)
	plan := ep.PlanFrom(from)
	// have returns whether the plan's step j is planned, waiting for it
	// (ctx-bound) when wait is set; plan then holds it.
	have := func(j int, wait bool) (bool, error) {
		if j < len(plan.Steps) || from+j >= ep.Info().Steps {
			return j < len(plan.Steps), nil
		}
		if wait {
			if err := ep.WaitPlanned(gctx, from+j+1); err != nil {
				return false, err
			}
		}
		plan = ep.PlanFrom(from)
		return j < len(plan.Steps), nil
	}
	want := func(step int) func(int) bool {
		here := proto.Pos{Epoch: e, Step: step}
		return func(dp int) bool {
			for mp := range p.cfg.MP {
				if !here.Less(p.epochs.Norm(next[dp*p.cfg.MP+mp])) {
					return true
				}
			}
			return false
		}
	}
	src := p.itemSource(ep)
	issued, t0 := 0, time.Now()
	for k := range ep.Info().Steps - from {
		for ; issued <= k+p.work.Ahead(); issued++ {
			if ok, err := have(issued, issued == k); err != nil {
				return err
			} else if !ok {
				break // issued when planned
			}
			if err := p.work.IssueStep(gctx, src, plan, plan.Steps[issued], want(plan.Steps[issued].Index), false); err != nil {
				return err
			}
		}
		for j := issued; j < min(len(plan.Steps), issued+p.work.Ahead()); j++ { // heavy items start early
			if err := p.work.IssueStep(gctx, src, plan, plan.Steps[j], want(plan.Steps[j].Index), true); err != nil {
				return err
			}
		}
		st := plan.Steps[k]
		if err := p.work.ReissueRejected(gctx); err != nil {
			return err
		}
		sb := plannedStep(ep, st)
		wait := time.Now()
		err := p.queueStepWith(gctx, ep, sb, next, func(ctx context.Context, r, gen int, stepBytes *atomic.Int64) error {
			return p.deliverRank(ctx, e, sb, r, gen, queues[r], stepBytes)
		})
		p.met.Preprocessed(time.Since(wait))
		p.work.ForgetStep(e, st.Index)
		if err != nil {
			return err
		}
		if p.epochs.PlanAheadDue(ep, p.cfg.LastEpoch, sb.Step, k+1, time.Since(t0)) {
			p.epochs.PlanAhead(ctx, e+1, p.log)
		}
	}
	return nil
}

// plannedStep is a step's rows as planned (ids and weights, no tensors):
// what the live report counts.
func plannedStep(ep *epochs.Plan, st balancer.Step) pipeline.StepBatch {
	f := ep.Prepared().Features
	sb := pipeline.StepBatch{Step: st.Index, Rows: make([][][]proto.Row, len(st.Ranks))}
	for r, mbs := range st.Ranks {
		sb.Rows[r] = make([][]proto.Row, len(mbs))
		for m, mb := range mbs {
			rows := make([]proto.Row, len(mb))
			for i, e := range mb {
				rows[i] = proto.Row{ID: f.ID(int(e.Item)), Weight: e.Weight}
			}
			sb.Rows[r][m] = rows
		}
	}
	return sb
}

// deliverRank queues rank r's micro-batches of a step as the workers
// deliver them.
func (p *Producer) deliverRank(ctx context.Context, e int, sb pipeline.StepBatch, r, gen int, q chan<- deliver.Out, stepBytes *atomic.Int64) error {
	dp, mp := r/p.cfg.MP, r%p.cfg.MP
	for mb, rows := range sb.Rows[dp] {
		payload, err := p.work.Wait(ctx, work.Key{Epoch: e, Step: sb.Step, DP: dp, MicroBatch: mb}, mp)
		if err != nil {
			return err
		}
		stepBytes.Add(int64(len(payload)))
		key := proto.BatchKey{Job: p.cfg.Job, Epoch: e, Step: sb.Step, MicroBatch: mb, DPRank: dp, MPRank: mp}
		m := deliver.NewOut(key, gen, payload, mb == len(sb.Rows[dp])-1)
		if err := deliver.QueueOut(ctx, q, m, rows, mp); err != nil {
			return err
		}
	}
	return nil
}

// itemSource is the served epoch ep as a work.ItemSource.
func (p *Producer) itemSource(ep *epochs.Plan) work.ItemSource {
	return work.ItemSource{Features: &ep.Prepared().Features, Epoch: ep.Info().Epoch, Image: p.cfg.Image,
		Meta: func(step, r int) (proto.BatchMeta, error) { return p.batchMeta(ep, step, r) }}
}
