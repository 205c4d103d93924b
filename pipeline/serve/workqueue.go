package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/internal/ctxutil"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// workPlanner is the planner role's side of the work queue: it issues the
// batch items of the steps ahead of the publisher, collects the workers'
// results (reassembling their chunks) and hands each rank's payloads to the
// publisher in plan order. It owns its lock and its result table.
type workPlanner struct {
	job    string
	mp     int
	js     jetstream.JetStream
	nc     *nats.Conn
	log    *slog.Logger
	config string // the preprocessing config's hash
	ahead  int    // steps issued ahead of the one being published

	mu      sync.Mutex
	slots   map[work.Key]*workSlot
	changed chan struct{} // closed and replaced when a slot fills
	asm     *proto.Reassembler[struct{}]
	feats   *featureResults
	timing  map[string]balancer.WorkCost // costs of the items filled and not yet timed, by id
	// costSum and costN: the costs of the items issued (the model's
	// prediction of their mean tells heavy items).
	costSum balancer.WorkCost
	costN   int
	// featureEntries and featureSeconds: the feature passes the workers did.
	featureEntries int
	featureSeconds float64
	model          balancer.WorkCostModel // item seconds from item costs, fitted to the workers' times
	tally          workTally              // this epoch
	total          workTally              // the job
	// queued is the step after the last one handed to the rank publishers
	// in this run (queuedOK); scale the autoscaling observations (nil
	// without a Service: the shard command).
	queued   pos
	queuedOK bool
	scale    *autoscaler

	// nonce and pubSeq make each publish's message id (publish).
	nonce  string
	pubSeq atomic.Int64
	// attempt bounds one publish of an item (publishAttempt).
	attempt time.Duration

	issued, results, duplicates atomic.Int64
	early                       atomic.Int64 // heavy items issued ahead of their step's window
	reissued                    atomic.Int64 // items published again after a rejected result
	failureReports              atomic.Int64 // workers' failure reports of batch items
	// rejects counts the results that did not match their item, by reason
	// (work.VerifyResult).
	rejects *prometheus.CounterVec
	// replyOK checks a result's reply subject before the result is read
	// (guardReplies).
	replyOK func(*nats.Msg) bool
}

// workSlot is one issued batch item and what came back of it.
type workSlot struct {
	id       string
	item     *work.BatchItem // as issued: what its results are verified against
	raw      []byte          // the item as published (a re-issue publishes it again)
	shapes   [][3]int32      // each row's planned C,H,W (plannedShapes)
	payloads [][]byte        // by mp rank, each verified
	have     int
	cost     balancer.WorkCost // what its CPU time depends on (costOf)
	// reissue: a result was rejected since the item was last published.
	// rejects counts the rejected results, failures the workers' failure
	// reports (itemMaxFailures); lastReject and lastFailure are the latest
	// reasons.
	reissue                 bool
	rejects, failures       int
	lastReject, lastFailure string
}

func newWorkPlanner(job string, mp, ahead int, js jetstream.JetStream, nc *nats.Conn, config string, log *slog.Logger) (*workPlanner, error) {
	cfg := proto.DefaultReassemblerConfig()
	cfg.MaxPending, cfg.Remember = 1024, 0
	asm, err := proto.NewReassembler[struct{}](cfg)
	if err != nil {
		return nil, err
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	rejects := newRejectCounter()
	return &workPlanner{nonce: hex.EncodeToString(nonce[:]), attempt: publishAttempt, job: job, mp: mp, js: js, nc: nc, log: log, config: config, ahead: ahead,
		slots: map[work.Key]*workSlot{}, changed: make(chan struct{}), asm: asm, replyOK: workerReply, feats: newFeatureResults(log, rejects), timing: map[string]balancer.WorkCost{},
		rejects: rejects}, nil
}

// reset forgets every slot and purges the job's items from the queue (a new
// run: a rewind or a replan changes what is needed).
func (w *workPlanner) reset(ctx context.Context) error {
	w.mu.Lock()
	w.slots = map[work.Key]*workSlot{}
	w.timing = map[string]balancer.WorkCost{}
	w.queuedOK = false
	w.mu.Unlock()
	st, err := w.js.Stream(ctx, work.Stream)
	if err != nil {
		return fmt.Errorf("serve: work stream: %w", err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(work.ItemsSubject(w.job))); err != nil {
		return fmt.Errorf("serve: purge work items: %w", err)
	}
	return nil
}

// subscribe installs the result handlers: one subscription for the batch
// results, so a worker's done message is handled after its chunks, and one
// for the feature results.
func (w *workPlanner) subscribe() ([]*nats.Subscription, error) {
	sub, err := w.nc.Subscribe(work.ResultSubject(w.job), w.handleResult)
	if err != nil {
		return nil, fmt.Errorf("serve: subscribe %s: %w", work.ResultSubject(w.job), err)
	}
	_ = sub.SetPendingLimits(-1, 1<<30)
	fsub, err := w.nc.Subscribe(work.FeaturesSubject(w.job), w.feats.handle)
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("serve: subscribe %s: %w", work.FeaturesSubject(w.job), err)
	}
	return []*nats.Subscription{sub, fsub}, nil
}

// deadline returns the item's predicted time and how long a worker keeps it
// to itself: four times the prediction plus a second, at least 2 s, at most
// 2 min; 10 s before anything was measured.
func (w *workPlanner) deadline(cost balancer.WorkCost) (pred, dl time.Duration) {
	w.mu.Lock()
	secs, fitted := w.model.Predict(cost), w.model.Fitted()
	w.mu.Unlock()
	if !fitted {
		return 0, 10 * time.Second
	}
	pred = time.Duration(secs * float64(time.Second))
	return pred, min(max(4*pred+time.Second, 2*time.Second), 2*time.Minute)
}

// heavy reports whether an item of this cost is predicted to take more
// than heavyFactor times the mean issued item (by the fitted model, or the
// prior before any measurement; the model is linear, so the mean item's
// prediction is the prediction of the mean cost). The caller holds w.mu.
func (w *workPlanner) heavy(cost balancer.WorkCost) bool {
	if w.costN == 0 {
		return false
	}
	var mean balancer.WorkCost
	for i := range mean {
		mean[i] = w.costSum[i] / float64(w.costN)
	}
	if w.model.Fitted() {
		return w.model.Predict(cost) > heavyFactor*w.model.Predict(mean)
	}
	return cost.Units() > heavyFactor*mean.Units()
}

// heavyFactor: an item predicted to cost more than this many times the
// mean item is heavy, and is issued up to WorkAhead steps earlier than the
// others, so that a few large images do not make their rank's batch late.
const heavyFactor = 4

// issueStep publishes the batch items of one step for the dp ranks that
// need it (want), one per micro-batch, except those already issued; with
// heavyOnly, only the heavy ones (heavyFactor).
func (w *workPlanner) issueStep(ctx context.Context, s *Service, ep *epochs.Plan, plan *balancer.Plan, st balancer.Step, want func(dp int) bool, heavyOnly bool) error {
	return w.issueStepOf(ctx, s.itemSource(ep), plan, st, want, heavyOnly)
}

// itemSource is what batch items are made of: the features the plan's
// entries index, the epoch, and each rank's batch metadata of a step (r is
// dp*mp + mp rank).
type itemSource struct {
	feats *pipeline.Features
	epoch int
	meta  func(step, r int) (proto.BatchMeta, error)
	// img is the job's image policy: with the features' sizes, the tensor
	// shape of each planned row (plannedShapes).
	img imgproc.Config
}

// itemSource is the served epoch ep as an itemSource.
func (s *Service) itemSource(ep *epochs.Plan) itemSource {
	return itemSource{feats: &ep.Prepared().Features, epoch: ep.Info().Epoch, img: s.cfg.Pipeline.Image,
		meta: func(step, r int) (proto.BatchMeta, error) { return s.batchMeta(ep, step, r) }}
}

// issueStepOf is issueStep for any itemSource (the service's epochs, a
// shard run's plan).
func (w *workPlanner) issueStepOf(ctx context.Context, src itemSource, plan *balancer.Plan, st balancer.Step, want func(dp int) bool, heavyOnly bool) error {
	for dp, mbs := range st.Ranks {
		if (heavyOnly && !w.detectsHeavy()) || !want(dp) {
			continue
		}
		for mb, entries := range mbs {
			k := work.Key{Epoch: src.epoch, Step: st.Index, DP: dp, MicroBatch: mb}
			cost := costOf(src.feats, entries)
			w.mu.Lock()
			_, done := w.slots[k]
			heavy := w.heavy(cost)
			w.mu.Unlock()
			if done || (heavyOnly && !heavy) {
				continue
			}
			it, err := w.item(src, plan, st.Index, dp, mb, entries, cost)
			if err != nil {
				return err
			}
			b, err := json.Marshal(it)
			if err != nil {
				return fmt.Errorf("serve: work item: %w", err)
			}
			w.mu.Lock()
			w.slots[k] = &workSlot{id: it.ID, item: it, raw: b, shapes: plannedShapes(src, entries), payloads: make([][]byte, w.mp), cost: cost}
			for i := range cost {
				w.costSum[i] += cost[i]
			}
			w.costN++
			w.mu.Unlock()
			if heavyOnly {
				w.early.Add(1)
			}
			if err := w.publish(ctx, b); err != nil {
				return fmt.Errorf("serve: issue work item %v: %w", k, err)
			}
			w.issued.Add(1)
		}
	}
	return nil
}

// publishRetry bounds how long issuing an item is retried while the work
// stream has no leader (a NATS server of the cluster died).
const publishRetry = 30 * time.Second

// publishAttempt bounds one publish of an item: a publish whose request or
// ack was lost with the stream leader that died (or with the connection to
// it) gets no answer, so it is sent again after this, whatever deadline the
// caller's context has. It is the jetstream client's default request
// timeout, which applied only to contexts without a deadline.
const publishAttempt = 5 * time.Second

// publish puts an item on the work queue, retrying while the stream elects a
// new leader: each attempt waits up to w.attempt for the stream's ack.
// Every call has its own message id (this planner's nonce and a sequence
// number), kept by its retries: a retry of a publish whose ack was lost (or
// came after the attempt gave up) is dropped by the stream's duplicate
// window, so the queue holds the item once; an item issued again later
// (after a reset, a takeover by another planner, a feature item re-issued)
// has a new id and is stored.
func (w *workPlanner) publish(ctx context.Context, b []byte) error {
	id := w.nonce + "-" + strconv.FormatInt(w.pubSeq.Add(1), 10)
	deadline := time.Now().Add(publishRetry)
	for {
		actx, cancel := context.WithTimeout(ctx, w.attempt)
		_, err := w.js.Publish(actx, work.ItemsSubject(w.job), b, jetstream.WithMsgID(id))
		cancel()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			if err != nil && ctx.Err() != nil {
				err = ctx.Err()
			}
			return err
		}
		w.log.Warn("work item not stored, retrying", "err", err)
		if err := ctxutil.Sleep(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

// detectsHeavy reports whether enough items were issued to tell heavy ones.
func (w *workPlanner) detectsHeavy() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.costN >= 16
}

func (w *workPlanner) item(src itemSource, plan *balancer.Plan, step, dp, mb int, entries []balancer.Entry, cost balancer.WorkCost) (*work.BatchItem, error) {
	it := &work.BatchItem{Kind: "batch", Config: w.config, Job: w.job, Epoch: src.epoch, Step: step, DP: dp, MicroBatch: mb,
		Samples: make([]work.Sample, len(entries))}
	for i, e := range entries {
		it.Samples[i] = work.SampleOf(pipeline.PlannedRow(src.feats, plan, e))
	}
	for mp := range w.mp {
		meta, err := src.meta(step, dp*w.mp+mp)
		if err != nil {
			return nil, err
		}
		meta.MicroBatch = mb
		it.Metas = append(it.Metas, meta)
	}
	pred, dl := w.deadline(cost)
	it.PredictedMS, it.DeadlineMS = pred.Milliseconds(), dl.Milliseconds()
	return it, it.Seal()
}

// plannedShapes returns the C,H,W tensor shape of each planned row: the
// image policy's output size for the image's header size (the features'),
// of the epoch's crop under augmentation.
// Nil when the features have no sizes.
func plannedShapes(src itemSource, entries []balancer.Entry) [][3]int32 {
	if len(src.feats.Sizes) != len(src.feats.Items) {
		return nil
	}
	out := make([][3]int32, len(entries))
	for i, e := range entries {
		sz := src.feats.Sizes[e.Item]
		w, h := pipeline.OutputSize(src.img, src.epoch, src.feats.Items[e.Item].ID, sz.X, sz.Y) // its crop under --augment
		out[i] = [3]int32{3, int32(h), int32(w)}
	}
	return out
}

// wait returns the payload of mp rank for the item at k once a worker has
// delivered the item.
func (w *workPlanner) wait(ctx context.Context, k work.Key, mp int) ([]byte, error) {
	warn := time.NewTimer(30 * time.Second)
	defer warn.Stop()
	for {
		w.mu.Lock()
		sl := w.slots[k]
		ch := w.changed
		if sl == nil {
			w.mu.Unlock()
			return nil, fmt.Errorf("serve: work item %+v was never issued: %w", k, ErrState)
		}
		if sl.have == w.mp {
			p := sl.payloads[mp]
			w.mu.Unlock()
			return p, nil
		}
		if sl.failures >= itemMaxFailures {
			err := fmt.Errorf("serve: work item %+v failed %d times on the workers, last: %s: %w", k, sl.failures, sl.lastFailure, ErrWorkFailed)
			w.mu.Unlock()
			return nil, err
		}
		rejects, failures, lastReject, lastFailure := sl.rejects, sl.failures, sl.lastReject, sl.lastFailure
		w.mu.Unlock()
		if err := w.reissueRejected(ctx); err != nil {
			return nil, err
		}
		select {
		case <-ch:
		case <-warn.C:
			w.log.Warn("waiting for workers", "epoch", k.Epoch, "step", k.Step, "dp", k.DP, "mb", k.MicroBatch,
				"issued", w.issued.Load(), "results", w.results.Load(), "rejected", rejects, "last_rejected", lastReject,
				"failed", failures, "last_failure", lastFailure)
			warn.Reset(30 * time.Second)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// forgetStep drops the slots of a step that was handed to the publishers.
func (w *workPlanner) forgetStep(epoch, step int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.queued, w.queuedOK = pos{epoch, step + 1}, true
	for k := range w.slots {
		if k.Epoch == epoch && k.Step == step {
			delete(w.slots, k)
		}
	}
}

// runEpochRemote is runEpoch for the planner role: the steps' rows are built
// by workers. It issues the items of the next WorkAhead steps ahead of the
// one it queues, and queues each rank's payloads in plan order as the
// workers deliver them, whatever order they finish in.
func (s *Service) runEpochRemote(ctx, gctx context.Context, e, from int, next []pos, queues []chan outMsg) error {
	ep, err := s.epoch(gctx, e)
	if err != nil {
		return err
	}
	if from >= ep.Info().Steps {
		return nil
	}
	defer s.work.logTally(e)
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
		here := pos{e, step}
		return func(dp int) bool {
			for mp := range s.cfg.MP {
				if !here.less(s.epochs.Norm(next[dp*s.cfg.MP+mp])) {
					return true
				}
			}
			return false
		}
	}
	issued, t0 := 0, time.Now()
	for k := range ep.Info().Steps - from {
		for ; issued <= k+s.work.ahead; issued++ {
			if ok, err := have(issued, issued == k); err != nil {
				return err
			} else if !ok {
				break // issued when planned
			}
			if err := s.work.issueStep(gctx, s, ep, plan, plan.Steps[issued], want(plan.Steps[issued].Index), false); err != nil {
				return err
			}
		}
		for j := issued; j < min(len(plan.Steps), issued+s.work.ahead); j++ { // heavy items start early
			if err := s.work.issueStep(gctx, s, ep, plan, plan.Steps[j], want(plan.Steps[j].Index), true); err != nil {
				return err
			}
		}
		st := plan.Steps[k]
		if err := s.work.reissueRejected(gctx); err != nil {
			return err
		}
		sb := plannedStep(ep, st)
		wait := time.Now()
		err := s.queueStepWith(gctx, ep, sb, next, func(ctx context.Context, r, gen int, stepBytes *atomic.Int64) error {
			return s.deliverRank(ctx, e, sb, r, gen, queues[r], stepBytes)
		})
		s.met.stage(stagePreprocess, time.Since(wait))
		s.work.forgetStep(e, st.Index)
		if err != nil {
			return err
		}
		if s.epochs.PlanAheadDue(ep, s.cfg.lastEpoch(), sb.Step, k+1, time.Since(t0)) {
			s.epochs.PlanAhead(ctx, e+1, s.log)
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
func (s *Service) deliverRank(ctx context.Context, e int, sb pipeline.StepBatch, r, gen int, q chan<- outMsg, stepBytes *atomic.Int64) error {
	dp, mp := r/s.cfg.MP, r%s.cfg.MP
	for mb, rows := range sb.Rows[dp] {
		payload, err := s.work.wait(ctx, work.Key{Epoch: e, Step: sb.Step, DP: dp, MicroBatch: mb}, mp)
		if err != nil {
			return err
		}
		stepBytes.Add(int64(len(payload)))
		key := proto.BatchKey{Job: s.cfg.Job, Epoch: e, Step: sb.Step, MicroBatch: mb, DPRank: dp, MPRank: mp}
		m := outMsg{key: key, gen: gen, payload: payload, last: mb == len(sb.Rows[dp])-1}
		if err := queueOut(ctx, q, m, rows, mp); err != nil {
			return err
		}
	}
	return nil
}

// setupWork creates the work queue and the job's work bucket (with the
// preprocessing config and tokenizer), and subscribes to the results.
func (s *Service) setupWork(ctx context.Context) ([]*nats.Subscription, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	wc, tok, err := work.NewConfig(s.cfg.Pipeline)
	if err != nil {
		return nil, err
	}
	if _, err := work.EnsureQueue(ctx, s.js, s.cfg.Replicas, s.cfg.WorkAckWait); err != nil {
		return nil, err
	}
	hash, err := work.EnsureBucket(ctx, s.js, s.cfg.Job, s.cfg.Replicas, wc, tok)
	if err != nil {
		return nil, err
	}
	if s.work, err = newWorkPlanner(s.cfg.Job, s.cfg.MP, s.cfg.WorkAhead, s.js, s.nc, hash, s.log); err != nil {
		return nil, err
	}
	s.work.guardReplies(s.workReplyOK("result"))
	for kind, c := range map[string]*atomic.Int64{"issued": &s.work.issued, "results": &s.work.results, "duplicates": &s.work.duplicates,
		"early": &s.work.early, "reissued": &s.work.reissued} {
		if err := s.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mmfeed_serve_work_items_total",
			Help: "Planner: batch items issued, answered by a worker, duplicate results dropped, heavy items issued early, and items issued again after a rejected result.", ConstLabels: prometheus.Labels{"kind": kind}},
			func() float64 { return float64(c.Load()) })); err != nil {
			return nil, fmt.Errorf("serve: metrics: %w", err)
		}
	}
	if err := s.work.registerTimes(s.reg); err != nil {
		return nil, err
	}
	if err := s.registerScale(); err != nil {
		return nil, fmt.Errorf("serve: metrics: %w", err)
	}
	if err := s.reg.Register(s.work.rejects); err != nil {
		return nil, fmt.Errorf("serve: metrics: %w", err)
	}
	for kind, c := range map[string]*atomic.Int64{"batch": &s.work.failureReports, "features": &s.work.feats.failureReports} {
		if err := s.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mmfeed_serve_work_failures_total",
			Help: "Planner: workers' reports that an item failed on the job's input (the dataset does not open there, another dataset); the reasons are in the log.", ConstLabels: prometheus.Labels{"kind": kind}},
			func() float64 { return float64(c.Load()) })); err != nil {
			return nil, fmt.Errorf("serve: metrics: %w", err)
		}
	}
	s.cfg.Pipeline.Features = s.features
	s.log.Info("planner: feature and batch items go to the work queue", "stream", work.Stream, "config", hash,
		"local_workers", s.cfg.LocalWorkers)
	return s.work.subscribe()
}
