package serve

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
	"github.com/mmfeed/mmfeed/pipeline/serve/report"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
	"golang.org/x/sync/errgroup"
)

// errRewind ends a preprocessing run early: a rank must be republished from
// an earlier step, or the rest of the epoch was replanned.
var errRewind = errors.New("rewind")

// publishLoop publishes every epoch from the ranks' cursors on. Between runs
// it applies rewinds (trainer restarts, resends); after the last epoch it
// waits for the trainers (WaitForTrainers) while still serving rewinds.
func (s *Service) publishLoop(ctx context.Context) error {
	defer s.epochs.WaitBackground()
	if err := s.awaitResize(ctx); err != nil {
		return err
	}
	end := proto.Pos{Epoch: s.cfg.lastEpoch() + 1, Step: 0}
	for {
		if err := s.publisher.Drain(ctx, s.ranks, rewindGlue{s}); err != nil {
			return err
		}
		start := s.ranks.MinCursor()
		if !start.Less(end) {
			if s.markFinished(ctx) {
				return nil
			}
			select {
			case req := <-s.publisher.Rewinds():
				s.publisher.Apply(ctx, req, s.ranks, rewindGlue{s})
			case <-s.publisher.Woken():
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		err := s.run(ctx, start)
		switch {
		case err == nil:
			s.ranks.Normalize() // cursors at the end of start's epoch move to the next one's start
		case errors.Is(err, errRewind) || (errors.Is(err, context.Canceled) && ctx.Err() == nil):
		default:
			return err
		}
	}
}

// markFinished records that everything is published and reports whether the
// service may stop.
func (s *Service) markFinished(ctx context.Context) bool {
	first := s.publisher.Finish()
	allDone := s.ranks.AllNeed(proto.Pos{Epoch: s.cfg.lastEpoch() + 1, Step: 0})
	if first {
		s.log.Info("every batch published", "epochs", s.cfg.Epochs)
		if err := s.st.putInt(ctx, kvFinished, s.cfg.lastEpoch()); err != nil {
			s.log.Warn("kv", "err", err)
		}
	}
	return allDone || !s.cfg.WaitForTrainers
}

// run preprocesses from start to the end of the job's last epoch. Each step
// is built and encoded for the ranks whose position is at it (ranks in
// parallel) and queued to the rank's publisher goroutine, which publishes in
// order and moves the rank's cursor after the step's last micro-batch. The
// epochs follow each other in one run: the next epoch's preprocessing starts
// (on its plan, prepared ahead) while the rank publishers still hand out the
// last steps of the previous one, so there is no pause at the boundary.
func (s *Service) run(ctx context.Context, start proto.Pos) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !s.publisher.StartRun(cancel) {
		return errRewind
	}
	defer s.publisher.EndRun()
	ranks := s.ranks.All()
	next := make([]proto.Pos, len(ranks)) // the next step to queue, per rank
	for r, rs := range ranks {
		next[r] = rs.Cursor()
	}
	g, gctx := errgroup.WithContext(rctx)
	queues := make([]chan deliver.Out, len(next))
	for r := range queues {
		queues[r] = make(chan deliver.Out, deliver.StepQueue*s.cfg.Pipeline.Plan.MicroBatches)
		g.Go(func() error { return deliver.PublishRank(gctx, s.publisher, r, queues[r], s.ranks, rankGlue{s}) })
	}
	mem := s.mem
	var err error
	if s.work != nil {
		err = s.work.Reset(gctx)
	}
	for e, from := start.Epoch, start.Step; e <= s.cfg.lastEpoch() && err == nil; e, from = e+1, 0 {
		if s.work != nil {
			err = s.runEpochRemote(ctx, gctx, e, from, next, queues)
		} else {
			err = s.runEpoch(ctx, gctx, mem, e, from, next, queues)
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
func (s *Service) runEpoch(ctx, gctx context.Context, mem memory.Allocator, e, from int, next []proto.Pos, queues []chan deliver.Out) error {
	ep, err := s.epoch(gctx, e)
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
			s.met.stage(stagePreprocess, time.Since(wait))
			err := s.queueStep(gctx, mem, ep, sb, next, queues)
			wait = time.Now()
			if done++; err == nil && s.epochs.PlanAheadDue(ep, s.cfg.lastEpoch(), sb.Step, done, time.Since(t0)) {
				s.epochs.PlanAhead(ctx, e+1, s.log)
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
func (s *Service) queueStep(ctx context.Context, mem memory.Allocator, ep *epochs.Plan, sb pipeline.StepBatch, next []proto.Pos, queues []chan deliver.Out) error {
	return s.queueStepWith(ctx, ep, sb, next, func(ctx context.Context, r, gen int, stepBytes *atomic.Int64) error {
		return s.encodeRank(ctx, mem, ep, sb, r, gen, queues[r], stepBytes)
	})
}

// queueStepWith is queueStep with the ranks' payloads made by enc (built
// here, or delivered by workers), which queues rank r's micro-batches of
// the step with generation gen.
func (s *Service) queueStepWith(ctx context.Context, ep *epochs.Plan, sb pipeline.StepBatch, next []proto.Pos,
	enc func(ctx context.Context, r, gen int, stepBytes *atomic.Int64) error) error {
	here := proto.Pos{Epoch: ep.Info().Epoch, Step: sb.Step}
	gens := make([]int, len(next))
	targets := s.ranks.Targets(here, next, gens)
	if len(targets) > 0 { // before a trainer can see the step and report on it
		s.live.Published(ep, sb)
		s.met.imbalance.Observe(report.Imbalance(ep.Predicted(sb.Step)))
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
	s.checkStreamRoom(sb.Step, stepBytes.Load(), len(targets))
	for _, r := range targets {
		next[r] = proto.Pos{Epoch: here.Epoch, Step: here.Step + 1}
	}
	if s.recalibrateDue(ctx, ep, sb.Step, next) {
		return errRewind
	}
	return nil
}

// checkStreamRoom warns once when a step of every rank (bytes encoded for
// ranks of them, scaled to all) takes more than half the stream: trainers
// that hold a step while they wait for each other leave room for the next
// one only then (waitTurn).
func (s *Service) checkStreamRoom(step int, bytes int64, ranks int) {
	if ranks == 0 || s.publisher.RoomWarned() {
		return
	}
	full := bytes * int64(s.ranks.Len()) / int64(ranks)
	if 2*full > s.cfg.StreamMaxBytes && s.publisher.ClaimRoomWarning() {
		s.log.Warn("the stream holds fewer than two steps: the service cannot publish ahead of trainers that hold a step while they wait for each other, and a step larger than the stream stalls them until ack_wait; raise --stream-max-bytes",
			"step", step, "step_bytes", full, "stream_max_bytes", s.cfg.StreamMaxBytes)
	}
}

// encodeRank builds and encodes the micro-batches of one rank and queues them.
func (s *Service) encodeRank(ctx context.Context, mem memory.Allocator, ep *epochs.Plan, sb pipeline.StepBatch, r, gen int, q chan<- deliver.Out, stepBytes *atomic.Int64) error {
	dp, mp := r/s.cfg.MP, r%s.cfg.MP
	meta, err := s.batchMeta(ep, sb.Step, r)
	if err != nil {
		return err
	}
	for mb, rows := range sb.Rows[dp] {
		meta.MicroBatch = mb
		payload, err := s.encodeBatch(mem, meta, rows)
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
func (s *Service) batchMeta(ep *epochs.Plan, step, r int) (proto.BatchMeta, error) {
	dp, mp := r/s.cfg.MP, r%s.cfg.MP
	mod, err := proto.ModalityFor(s.cfg.layout().Placement, s.cfg.MP, mp)
	if err != nil {
		return proto.BatchMeta{}, err
	}
	meta := ep.Prepared().BatchMeta(s.cfg.Job, ep.Info().Epoch, mod, ep.Prepared().Config.Plan.Pack)
	meta.Step, meta.DPRank, meta.MPRank = step, dp, mp
	return meta, nil
}

// encodeBatch builds and encodes one micro-batch's record (work.EncodeRows),
// timing both stages.
func (s *Service) encodeBatch(mem memory.Allocator, meta proto.BatchMeta, rows []proto.Row) ([]byte, error) {
	payload, build, encode, err := work.EncodeRows(mem, meta, rows)
	if err != nil {
		return nil, err
	}
	s.met.stage(stageBuild, build)
	s.met.stage(stageEncode, encode)
	return payload, nil
}

// requestRewind queues a rewind and stops the current run so the publisher
// applies it at once.
func (s *Service) requestRewind(ctx context.Context, req deliver.Rewind) error {
	return s.publisher.Request(ctx, req)
}

// finishedPublishing reports whether every batch of the job was published.
func (s *Service) finishedPublishing() bool { return s.publisher.Finished() }
