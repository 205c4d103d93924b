package produce

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
	"golang.org/x/sync/errgroup"
)

// errRewind ends a preprocessing run early: a rank must be republished from
// an earlier step, or the rest of the epoch was replanned.
var errRewind = errors.New("rewind")

// Run publishes every epoch from the ranks' cursors on. Between runs
// it applies rewinds (trainer restarts, resends); after the last epoch it
// waits for the trainers (WaitForTrainers) while still serving rewinds.
func (p *Producer) Run(ctx context.Context) error {
	defer p.epochs.WaitBackground()
	if err := p.svc.AwaitResize(ctx); err != nil {
		return err
	}
	end := proto.Pos{Epoch: p.cfg.LastEpoch + 1, Step: 0}
	for {
		if err := p.publisher.Drain(ctx, p.ranks, p.rewind); err != nil {
			return err
		}
		start := p.ranks.MinCursor()
		if !start.Less(end) {
			if p.markFinished(ctx) {
				return nil
			}
			select {
			case req := <-p.publisher.Rewinds():
				p.publisher.Apply(ctx, req, p.ranks, p.rewind)
			case <-p.publisher.Woken():
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		err := p.run(ctx, start)
		switch {
		case err == nil:
			p.ranks.Normalize() // cursors at the end of start's epoch move to the next one's start
		case errors.Is(err, errRewind) || (errors.Is(err, context.Canceled) && ctx.Err() == nil):
		default:
			return err
		}
	}
}

// markFinished records that everything is published and reports whether the
// service may stop.
func (p *Producer) markFinished(ctx context.Context) bool {
	first := p.publisher.Finish()
	allDone := p.ranks.AllNeed(proto.Pos{Epoch: p.cfg.LastEpoch + 1, Step: 0})
	if first {
		p.log.Info("every batch published", "epochs", p.cfg.Epochs)
		if err := p.svc.RecordFinished(ctx, p.cfg.LastEpoch); err != nil {
			p.log.Warn("kv", "err", err)
		}
	}
	return allDone || !p.cfg.WaitForTrainers
}

// run preprocesses from start to the end of the job's last epoch. Each step
// is built and encoded for the ranks whose position is at it (ranks in
// parallel) and queued to the rank's publisher goroutine, which publishes in
// order and moves the rank's cursor after the step's last micro-batch. The
// epochs follow each other in one run: the next epoch's preprocessing starts
// (on its plan, prepared ahead) while the rank publishers still hand out the
// last steps of the previous one, so there is no pause at the boundary.
func (p *Producer) run(ctx context.Context, start proto.Pos) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !p.publisher.StartRun(cancel) {
		return errRewind
	}
	defer p.publisher.EndRun()
	ranks := p.ranks.All()
	next := make([]proto.Pos, len(ranks)) // the next step to queue, per rank
	for r, rs := range ranks {
		next[r] = rs.Cursor()
	}
	g, gctx := errgroup.WithContext(rctx)
	queues := make([]chan deliver.Out, len(next))
	for r := range queues {
		queues[r] = make(chan deliver.Out, deliver.StepQueue*p.cfg.MicroBatches)
		g.Go(func() error { return deliver.PublishRank(gctx, p.publisher, r, queues[r], p.ranks, p.rank) })
	}
	mem := p.mem
	var err error
	if p.work != nil {
		err = p.work.Reset(gctx)
	}
	for e, from := start.Epoch, start.Step; e <= p.cfg.LastEpoch && err == nil; e, from = e+1, 0 {
		if p.work != nil {
			err = p.runEpochRemote(ctx, gctx, e, from, next, queues)
		} else {
			err = p.runEpoch(ctx, gctx, mem, e, from, next, queues)
		}
	}
	for _, q := range queues {
		close(q)
	}
	if gerr := g.Wait(); gerr != nil && (err == nil || errors.Is(err, context.Canceled)) {
		err = gerr
	}
	if err != nil && ctx.Err() == nil && rctx.Err() != nil {
		return errRewind
	}
	return err
}

// runEpoch preprocesses epoch e from step from and queues its steps, the
// steps planned so far at a time (waiting for the next one when it has run
// out); ctx is the publisher's (planning ahead outlives a rewind), gctx the
// run's.
func (p *Producer) runEpoch(ctx, gctx context.Context, mem memory.Allocator, e, from int, next []proto.Pos, queues []chan deliver.Out) error {
	ep, err := p.epochs.Epoch(gctx, e)
	if err != nil {
		return err
	}
	if from >= ep.Info().Steps {
		return nil
	}
	pp, err := pipeline.NewPreprocessor(ep.Prepared())
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	wait, t0, done := time.Now(), time.Now(), 0
	for from < ep.Info().Steps {
		if err := ep.WaitPlanned(gctx, from+1); err != nil {
			return err
		}
		plan := ep.PlanFrom(from)
		err := pp.Run(gctx, plan, func(sb pipeline.StepBatch) error {
			p.met.Preprocessed(time.Since(wait))
			err := p.queueStep(gctx, mem, ep, sb, next, queues)
			wait = time.Now()
			if done++; err == nil && p.epochs.PlanAheadDue(ep, p.cfg.LastEpoch, sb.Step, done, time.Since(t0)) {
				p.epochs.PlanAhead(ctx, e+1, p.log)
			}
			return err
		})
		if err != nil {
			return err
		}
		from += len(plan.Steps)
	}
	return nil
}

// queueStep builds and encodes one step for every rank whose next position
// is at it and queues the payloads; it reports errRewind when a
// recalibration replanned the rest of the epoch.
func (p *Producer) queueStep(ctx context.Context, mem memory.Allocator, ep *epochs.Plan, sb pipeline.StepBatch, next []proto.Pos, queues []chan deliver.Out) error {
	return p.queueStepWith(ctx, ep, sb, next, func(ctx context.Context, r, gen int, stepBytes *atomic.Int64) error {
		return p.encodeRank(ctx, mem, ep, sb, r, gen, queues[r], stepBytes)
	})
}

// queueStepWith is queueStep with the ranks' payloads made by enc (built
// here, or delivered by workers), which queues rank r's micro-batches of
// the step with generation gen.
func (p *Producer) queueStepWith(ctx context.Context, ep *epochs.Plan, sb pipeline.StepBatch, next []proto.Pos,
	enc func(ctx context.Context, r, gen int, stepBytes *atomic.Int64) error) error {
	here := proto.Pos{Epoch: ep.Info().Epoch, Step: sb.Step}
	gens := make([]int, len(next))
	targets := p.ranks.Targets(here, next, gens)
	if len(targets) > 0 { // before a trainer can see the step and report on it
		p.live.Published(ep, sb)
		p.met.Imbalance(ep.Predicted(sb.Step))
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(1, runtime.GOMAXPROCS(0)))
	var stepBytes atomic.Int64
	for _, r := range targets {
		g.Go(func() error { return enc(gctx, r, gens[r], &stepBytes) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	p.checkStreamRoom(sb.Step, stepBytes.Load(), len(targets))
	for _, r := range targets {
		next[r] = proto.Pos{Epoch: here.Epoch, Step: here.Step + 1}
	}
	if p.svc.RecalibrateDue(ctx, ep, sb.Step, next) {
		return errRewind
	}
	return nil
}

// checkStreamRoom warns once when a step of every rank (bytes encoded for
// ranks of them, scaled to all) takes more than half the stream: trainers
// that hold a step while they wait for each other leave room for the next
// one only then (deliver.Ranks.WaitTurn).
func (p *Producer) checkStreamRoom(step int, bytes int64, ranks int) {
	if ranks == 0 || p.publisher.RoomWarned() {
		return
	}
	full := bytes * int64(p.ranks.Len()) / int64(ranks)
	if 2*full > p.cfg.StreamMaxBytes && p.publisher.ClaimRoomWarning() {
		p.log.Warn("the stream holds fewer than two steps: the service cannot publish ahead of trainers that hold a step while they wait for each other, and a step larger than the stream stalls them until ack_wait; raise --stream-max-bytes",
			"step", step, "step_bytes", full, "stream_max_bytes", p.cfg.StreamMaxBytes)
	}
}

// encodeRank builds and encodes the micro-batches of one rank and queues them.
func (p *Producer) encodeRank(ctx context.Context, mem memory.Allocator, ep *epochs.Plan, sb pipeline.StepBatch, r, gen int, q chan<- deliver.Out, stepBytes *atomic.Int64) error {
	dp, mp := r/p.cfg.MP, r%p.cfg.MP
	meta, err := p.batchMeta(ep, sb.Step, r)
	if err != nil {
		return err
	}
	for mb, rows := range sb.Rows[dp] {
		meta.MicroBatch = mb
		payload, err := p.encodeBatch(mem, meta, rows)
		if err != nil {
			return err
		}
		stepBytes.Add(int64(len(payload)))
		m := deliver.NewOut(meta.Key(), gen, payload, mb == len(sb.Rows[dp])-1)
		if err := deliver.QueueOut(ctx, q, m, rows, mp); err != nil {
			return err
		}
	}
	return nil
}

// batchMeta returns the metadata of rank r's batches of step (micro-batch 0).
func (p *Producer) batchMeta(ep *epochs.Plan, step, r int) (proto.BatchMeta, error) {
	dp, mp := r/p.cfg.MP, r%p.cfg.MP
	mod, err := proto.ModalityFor(p.cfg.Placement, p.cfg.MP, mp)
	if err != nil {
		return proto.BatchMeta{}, err
	}
	meta := ep.Prepared().BatchMeta(p.cfg.Job, ep.Info().Epoch, mod, ep.Prepared().Config.Plan.Pack)
	meta.Step, meta.DPRank, meta.MPRank = step, dp, mp
	return meta, nil
}

// encodeBatch builds and encodes one micro-batch's record (work.EncodeRows),
// timing both stages.
func (p *Producer) encodeBatch(mem memory.Allocator, meta proto.BatchMeta, rows []proto.Row) ([]byte, error) {
	payload, build, encode, err := work.EncodeRows(mem, meta, rows)
	if err != nil {
		return nil, err
	}
	p.met.Built(build)
	p.met.Encoded(encode)
	return payload, nil
}
