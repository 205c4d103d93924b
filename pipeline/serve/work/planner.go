package work

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
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Planner is the planner role's side of the work queue: it issues the
// batch items of the steps ahead of the publisher (IssueStep), collects the
// workers' results (reassembling their chunks) and hands each rank's
// payloads to the publisher in plan order (Wait, ForgetStep); it runs the
// feature passes (Features) and times the items (Times). It owns its lock
// and its result table: callers read them through its methods.
type Planner struct {
	job    string
	mp     int
	js     jetstream.JetStream
	nc     *nats.Conn
	log    *slog.Logger
	config string // the preprocessing config's hash
	ahead  int    // steps issued ahead of the one being published

	mu      sync.Mutex
	slots   map[Key]*workSlot
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
	tally          Tally                  // this epoch
	total          Tally                  // the job
	// queued is the step after the last one handed to the rank publishers
	// in this run (queuedOK); scale the autoscaling observations (nil
	// before SetAutoscaler: the shard command).
	queued   proto.Pos
	queuedOK bool
	scale    *Autoscaler

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
	// (VerifyResult).
	rejects *rejectCounts
	// replyOK checks a result's reply subject before the result is read
	// (GuardReplies).
	replyOK func(*nats.Msg) bool
}

// workSlot is one issued batch item and what came back of it.
type workSlot struct {
	id       string
	item     *BatchItem // as issued: what its results are verified against
	raw      []byte     // the item as published (a re-issue publishes it again)
	shapes   [][3]int32 // each row's planned C,H,W (plannedShapes)
	payloads [][]byte   // by mp rank, each verified
	have     int
	cost     balancer.WorkCost // what its CPU time depends on (costOf)
	// reissue: a result was rejected since the item was last published.
	// rejects counts the rejected results, failures the workers' failure
	// reports (ItemMaxFailures); lastReject and lastFailure are the latest
	// reasons.
	reissue                 bool
	rejects, failures       int
	lastReject, lastFailure string
}

// NewPlanner makes the planner of job's items for mp ranks per dp rank,
// issuing ahead steps past the one being published, on js (the items) and
// nc (the results); config is the hash of the preprocessing config in the
// job's work bucket.
func NewPlanner(job string, mp, ahead int, js jetstream.JetStream, nc *nats.Conn, config string, log *slog.Logger) (*Planner, error) {
	cfg := proto.DefaultReassemblerConfig()
	cfg.MaxPending, cfg.Remember = 1024, 0
	asm, err := proto.NewReassembler[struct{}](cfg)
	if err != nil {
		return nil, err
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	rejects := newRejectCounts()
	return &Planner{nonce: hex.EncodeToString(nonce[:]), attempt: publishAttempt, job: job, mp: mp, js: js, nc: nc, log: log, config: config, ahead: ahead,
		slots: map[Key]*workSlot{}, changed: make(chan struct{}), asm: asm, replyOK: workerReply, feats: newFeatureResults(log, rejects), timing: map[string]balancer.WorkCost{},
		rejects: rejects}, nil
}

// Reset forgets every slot and purges the job's items from the queue (a new
// run: a rewind or a replan changes what is needed).
func (w *Planner) Reset(ctx context.Context) error {
	w.mu.Lock()
	w.slots = map[Key]*workSlot{}
	w.timing = map[string]balancer.WorkCost{}
	w.queuedOK = false
	w.mu.Unlock()
	st, err := w.js.Stream(ctx, Stream)
	if err != nil {
		return fmt.Errorf("serve: work stream: %w", err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(ItemsSubject(w.job))); err != nil {
		return fmt.Errorf("serve: purge work items: %w", err)
	}
	return nil
}

// Subscribe installs the result handlers: one subscription for the batch
// results, so a worker's done message is handled after its chunks, and one
// for the feature results.
func (w *Planner) Subscribe() ([]*nats.Subscription, error) {
	sub, err := w.nc.Subscribe(ResultSubject(w.job), w.handleResult)
	if err != nil {
		return nil, fmt.Errorf("serve: subscribe %s: %w", ResultSubject(w.job), err)
	}
	_ = sub.SetPendingLimits(-1, 1<<30)
	fsub, err := w.nc.Subscribe(FeaturesSubject(w.job), w.feats.handle)
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("serve: subscribe %s: %w", FeaturesSubject(w.job), err)
	}
	return []*nats.Subscription{sub, fsub}, nil
}

// deadline returns the item's predicted time and how long a worker keeps it
// to itself: four times the prediction plus a second, at least 2 s, at most
// 2 min; 10 s before anything was measured.
func (w *Planner) deadline(cost balancer.WorkCost) (pred, dl time.Duration) {
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
func (w *Planner) heavy(cost balancer.WorkCost) bool {
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

// ItemSource is what batch items are made of: the features the plan's
// entries index, the epoch, and each rank's batch metadata of a step (r is
// dp*mp + mp rank).
type ItemSource struct {
	Features *pipeline.Features
	Epoch    int
	Meta     func(step, r int) (proto.BatchMeta, error)
	// Image is the job's image policy: with the features' sizes, the tensor
	// shape of each planned row (plannedShapes).
	Image imgproc.Config
}

// IssueStep publishes the batch items of one step of plan for the dp ranks
// that need it (want), one per micro-batch, except those already issued;
// with heavyOnly, only the heavy ones (heavyFactor). src is what the items
// are made of (the service's epoch, a shard run's plan).
func (w *Planner) IssueStep(ctx context.Context, src ItemSource, plan *balancer.Plan, st balancer.Step, want func(dp int) bool, heavyOnly bool) error {
	for dp, mbs := range st.Ranks {
		if (heavyOnly && !w.detectsHeavy()) || !want(dp) {
			continue
		}
		for mb, entries := range mbs {
			k := Key{Epoch: src.Epoch, Step: st.Index, DP: dp, MicroBatch: mb}
			cost := costOf(src.Features, entries)
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
func (w *Planner) publish(ctx context.Context, b []byte) error {
	id := w.nonce + "-" + strconv.FormatInt(w.pubSeq.Add(1), 10)
	deadline := time.Now().Add(publishRetry)
	for {
		actx, cancel := context.WithTimeout(ctx, w.attempt)
		_, err := w.js.Publish(actx, ItemsSubject(w.job), b, jetstream.WithMsgID(id))
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
func (w *Planner) detectsHeavy() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.costN >= 16
}

func (w *Planner) item(src ItemSource, plan *balancer.Plan, step, dp, mb int, entries []balancer.Entry, cost balancer.WorkCost) (*BatchItem, error) {
	it := &BatchItem{Kind: "batch", Config: w.config, Job: w.job, Epoch: src.Epoch, Step: step, DP: dp, MicroBatch: mb,
		Samples: make([]Sample, len(entries))}
	for i, e := range entries {
		it.Samples[i] = SampleOf(pipeline.PlannedRow(src.Features, plan, e))
	}
	for mp := range w.mp {
		meta, err := src.Meta(step, dp*w.mp+mp)
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
func plannedShapes(src ItemSource, entries []balancer.Entry) [][3]int32 {
	if len(src.Features.Sizes) != len(src.Features.Items) {
		return nil
	}
	out := make([][3]int32, len(entries))
	for i, e := range entries {
		sz := src.Features.Sizes[e.Item]
		w, h := pipeline.OutputSize(src.Image, src.Epoch, src.Features.Items[e.Item].ID, sz.X, sz.Y) // its crop under --augment
		out[i] = [3]int32{3, int32(h), int32(w)}
	}
	return out
}

// Wait returns the payload of mp rank for the item at k once a worker has
// delivered the item.
func (w *Planner) Wait(ctx context.Context, k Key, mp int) ([]byte, error) {
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
		if sl.failures >= ItemMaxFailures {
			err := fmt.Errorf("serve: work item %+v failed %d times on the workers, last: %s: %w", k, sl.failures, sl.lastFailure, ErrWorkFailed)
			w.mu.Unlock()
			return nil, err
		}
		rejects, failures, lastReject, lastFailure := sl.rejects, sl.failures, sl.lastReject, sl.lastFailure
		w.mu.Unlock()
		if err := w.ReissueRejected(ctx); err != nil {
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

// ForgetStep drops the slots of a step that was handed to the publishers.
func (w *Planner) ForgetStep(epoch, step int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.queued, w.queuedOK = proto.Pos{Epoch: epoch, Step: step + 1}, true
	for k := range w.slots {
		if k.Epoch == epoch && k.Step == step {
			delete(w.slots, k)
		}
	}
}

// Ahead is how many steps past the one being published the planner issues.
func (w *Planner) Ahead() int { return w.ahead }

// Counts are the planner's item counters since it was made.
type Counts struct {
	// Issued, Results, Duplicates, Early and Reissued count the batch items
	// issued, those a worker answered in full, the duplicate results
	// dropped, the heavy items issued ahead of their step's window and the
	// items issued again after a rejected result.
	Issued, Results, Duplicates, Early, Reissued int64
	// BatchFailures and FeatureFailures count the workers' failure reports
	// of batch and feature items.
	BatchFailures, FeatureFailures int64
	// Rejected counts the results that did not match their item, by reason
	// (every one of RejectReasons, 0 or more).
	Rejected map[string]int64
}

// Counts returns the planner's counters now.
func (w *Planner) Counts() Counts {
	return Counts{Issued: w.issued.Load(), Results: w.results.Load(), Duplicates: w.duplicates.Load(), Early: w.early.Load(),
		Reissued: w.reissued.Load(), BatchFailures: w.failureReports.Load(), FeatureFailures: w.feats.failureReports.Load(),
		Rejected: w.rejects.snapshot()}
}
