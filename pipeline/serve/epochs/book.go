package epochs

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/internal/ctxutil"
	"github.com/mmfeed/mmfeed/proto"
)

// planJob is one epoch's preparation, run once (by the publisher when it
// reaches the epoch, or ahead of it while the previous epoch is published).
type planJob struct {
	done    chan struct{}
	ep      *Plan
	err     error
	seconds float64 // how long preparing took
}

// PrepareFunc prepares epoch e (Prepare) and records its info (Book.Record);
// stored is the info recorded before (nil: none).
type PrepareFunc func(ctx context.Context, e int, stored *Info) (*Plan, error)

// Book owns the job's epochs: their infos (what a register reply
// needs, as recorded in the KV bucket), their plans held in memory, the
// preparations started, and the epoch being published.
//
// Invariants, under mu:
//   - a plan is prepared once: concurrent callers of Prepared share one
//     planJob (a failed one is tried again);
//   - plans[e] set implies infos[e] set; planned is closed (and replaced)
//     whenever infos gains an epoch;
//   - plans before active-1 are closed and dropped (active-1 stays for late
//     feedback and viewers);
//   - mu also guards the parts of a held plan the publisher changes
//     (steps, feats, info: a recalibration), against readers elsewhere.
//
// Goroutines it starts (planning ahead, recording the active epoch) are
// counted in ahead; the publisher waits for them before it returns. mu is
// a leaf but for a held plan's planning lock (itself a leaf): nothing else
// that takes a lock is called with it held. Closing a plan with it held
// waits for the plan's background planner, which never takes mu.
type Book struct {
	mu      sync.Mutex
	infos   map[int]Info
	plans   map[int]*Plan
	jobs    map[int]*planJob // preparations started, by epoch
	active  int              // the epoch being published (-1 before the first)
	planned chan struct{}
	ahead   sync.WaitGroup
	prepare PrepareFunc
	kv      Store // where epoch infos are recorded (InfoKey); only the book writes them
}

// kvEpochInfo + epoch: the epoch's Info (JSON), in the job's KV bucket.
const kvEpochInfo = "epoch."

// InfoKey is the job's KV key of epoch e's info (Info, JSON). Anyone
// may read it; only the book writes or deletes it (internal/arch).
func InfoKey(e int) string { return kvEpochInfo + strconv.Itoa(e) }

// Store is the job's KV bucket as the book writes it: a JSON value put
// at a key, a key deleted (a missing key is no error).
type Store interface {
	PutJSON(ctx context.Context, key string, v any) error
	Delete(ctx context.Context, key string) error
}

// NewBook returns an empty book that prepares epochs with prepare and
// records their infos in kv (either may be nil where the caller never
// prepares or records: tests of the positions).
func NewBook(prepare PrepareFunc, kv Store) *Book {
	return &Book{infos: map[int]Info{}, plans: map[int]*Plan{}, jobs: map[int]*planJob{}, active: -1,
		planned: make(chan struct{}), prepare: prepare, kv: kv}
}

// Record writes epoch e's info to the job's KV bucket (InfoKey).
func (b *Book) Record(ctx context.Context, e int, info Info) error {
	return b.kv.PutJSON(ctx, InfoKey(e), info)
}

// RecordAll writes every epoch info the book holds again (a recreated bucket).
func (b *Book) RecordAll(ctx context.Context) error {
	for e, info := range b.AllInfos() {
		if err := b.Record(ctx, e, info); err != nil {
			return err
		}
	}
	return nil
}

// Unrecord deletes the recorded infos of epochs es (a resize plans them again).
func (b *Book) Unrecord(ctx context.Context, es []int) error {
	for _, e := range es {
		if err := b.kv.Delete(ctx, InfoKey(e)); err != nil {
			return err
		}
	}
	return nil
}

// ReplanRest replans the held plan ep from its first step after step and
// after every queued position of its epoch (from; -1 when a later epoch is
// queued already, and nothing is done) with seg(from), records the new info,
// and keeps the old plan when the record fails (err). replanned is false
// when the replan would change the step count (Plan.replan). The only
// writer of a held plan's steps after planning; its readers hold mu.
func (b *Book) ReplanRest(ctx context.Context, ep *Plan, step int, queued []proto.Pos,
	seg func(from int) Segment) (from int, replanned bool, err error) {
	e := ep.info.Epoch
	b.mu.Lock()
	from = step + 1 // after every step queued or published
	for _, q := range queued {
		if q.Epoch > e {
			b.mu.Unlock()
			return -1, false, nil
		}
		if q.Epoch == e {
			from = max(from, q.Step)
		}
	}
	oldSteps, oldInfo := ep.steps, ep.info
	replanned = ep.replan(seg(from))
	info := ep.info
	b.mu.Unlock()
	if !replanned {
		return from, false, nil
	}
	if err := b.Record(ctx, e, info); err != nil {
		b.mu.Lock()
		ep.steps, ep.info = oldSteps, oldInfo
		for k := from; k < len(oldSteps); k++ {
			ep.feats[k] = ep.stepFeatures(oldSteps[k])
		}
		b.mu.Unlock()
		return from, false, err
	}
	b.SetInfo(e, info)
	return from, true, nil
}

// Info returns epoch e's info, if it is planned.
func (b *Book) Info(e int) (Info, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	info, ok := b.infos[e]
	return info, ok
}

// SetInfo records epoch e's info (restore, a recalibration).
func (b *Book) SetInfo(e int, info Info) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.infos[e] = info
}

// AllInfos returns a copy of every epoch's info.
func (b *Book) AllInfos() map[int]Info {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[int]Info, len(b.infos))
	for e, in := range b.infos {
		out[e] = in
	}
	return out
}

// Forget drops the infos of epochs es (a resize plans them again).
func (b *Book) Forget(es []int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range es {
		delete(b.infos, e)
	}
}

// Steps returns epoch e's step count (0 while it is not planned).
func (b *Book) Steps(e int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.infos[e].Steps
}

// Norm maps (e, steps of e) to (e+1, 0).
func (b *Book) Norm(p proto.Pos) proto.Pos {
	b.mu.Lock()
	defer b.mu.Unlock()
	if info, ok := b.infos[p.Epoch]; ok && p.Step >= info.Steps {
		return proto.Pos{Epoch: p.Epoch + 1, Step: 0}
	}
	return p
}

// StepBefore returns the step before p (the last completed one when p is
// the next needed).
func (b *Book) StepBefore(p proto.Pos) (proto.Pos, bool) {
	if p.Step > 0 {
		return proto.Pos{Epoch: p.Epoch, Step: p.Step - 1}, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if info, ok := b.infos[p.Epoch-1]; ok && info.Steps > 0 {
		return proto.Pos{Epoch: p.Epoch - 1, Step: info.Steps - 1}, true
	}
	return proto.Pos{}, false
}

// WaitInfo returns the info of epoch e, waiting up to wait while it is
// planned.
func (b *Book) WaitInfo(ctx context.Context, e int, wait time.Duration) (Info, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		b.mu.Lock()
		info, ok := b.infos[e]
		planned := b.planned
		b.mu.Unlock()
		if ok {
			return info, nil
		}
		select {
		case <-planned:
		case <-t.C:
			return Info{}, fmt.Errorf("serve: register: epoch %d is still being planned, register again: %w", e, ErrNotReady)
		case <-ctx.Done():
			return Info{}, ctx.Err()
		}
	}
}

// Plan returns epoch e's plan when it is held in memory.
func (b *Book) Plan(e int) *Plan {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.plans[e]
}

// Features returns dp rank's feature sum of step of epoch e, when e's plan
// is held.
func (b *Book) Features(e, step, dp int) (balancer.Features, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ep := b.plans[e]
	if ep == nil || step < 0 || step >= ep.prog.steps() || dp < 0 || dp >= len(ep.feats[step]) {
		return balancer.Features{}, false
	}
	return ep.feats[step][dp], true
}

// Started reports whether epoch e's preparation started (or its plan is
// held).
func (b *Book) Started(e int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.jobs[e] != nil || b.plans[e] != nil
}

// PlanFrom returns ep's served steps from start on as a plan for the
// Preprocessor (Plan.PlanFrom), read under the lock a recalibration
// replaces them under; ok is false when start is outside the n steps or
// not planned yet.
func (b *Book) PlanFrom(ep *Plan, start int) (plan *balancer.Plan, n int, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if start < 0 || start >= len(ep.steps) {
		return nil, len(ep.steps), false
	}
	plan = ep.PlanFrom(start)
	return plan, len(ep.steps), len(plan.Steps) > 0
}

// Prepared returns epoch e's plan, preparing it unless that is done or
// under way; concurrent callers share one preparation. A preparation that
// failed is tried again.
func (b *Book) Prepared(ctx context.Context, e int) (*Plan, error) {
	job, run := b.job(e)
	if job == nil {
		return b.Plan(e), nil
	}
	if run {
		b.run(ctx, e, job)
	}
	select {
	case <-job.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return job.ep, job.err
}

// job returns epoch e's preparation (nil: the plan is held) and whether the
// caller must run it (it was registered just now).
func (b *Book) job(e int) (*planJob, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.plans[e] != nil {
		return nil, false
	}
	job := b.jobs[e]
	if job == nil || (job.err != nil && ctxutil.Closed(job.done)) {
		job = &planJob{done: make(chan struct{})}
		b.jobs[e] = job
		return job, true
	}
	return job, false
}

func (b *Book) run(ctx context.Context, e int, job *planJob) {
	defer close(job.done)
	var stored *Info
	if info, known := b.Info(e); known {
		stored = &info
	}
	t0 := time.Now()
	ep, err := b.prepare(ctx, e, stored)
	if err != nil {
		job.err = err
		return
	}
	job.seconds = time.Since(t0).Seconds()
	b.mu.Lock()
	b.plans[e], b.infos[e] = ep, ep.info
	close(b.planned)
	b.planned = make(chan struct{})
	b.mu.Unlock()
	job.ep = ep
}

// Activate makes e the epoch being published and releases the plans
// before e-1. It reports whether e was not active already.
func (b *Book) Activate(e int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.active == e {
		return false
	}
	for old, p := range b.plans {
		if old < e-1 {
			p.Close()
			delete(b.plans, old)
			delete(b.jobs, old)
		}
	}
	b.active = e
	return true
}

// PlanAheadDue reports whether to start planning the epoch after ep once
// step (of stepsDone so far in this run, which took elapsed) is queued:
// when the rest of ep takes about four times as long to publish as
// preparing ep took, plus two steps (planning ahead competes with the
// preprocessing for the cores, and is slower than planning alone: twice was
// too little on this machine). Later is better for calibration (the next
// epoch's model sees more feedback), earlier closes the gap at the boundary.
// last is the job's last epoch.
func (b *Book) PlanAheadDue(ep *Plan, last, step, stepsDone int, elapsed time.Duration) bool {
	e := ep.info.Epoch
	if e >= last || stepsDone == 0 {
		return false
	}
	b.mu.Lock()
	_, started := b.jobs[e+1]
	_, known := b.plans[e+1]
	job := b.jobs[e]
	b.mu.Unlock()
	if started || known {
		return false
	}
	planSeconds := 1.0 // a restarted service did not time this epoch's preparation
	if job != nil && job.seconds > 0 {
		planSeconds = job.seconds
	}
	perStep := elapsed.Seconds() / float64(stepsDone)
	ahead := int(math.Ceil(4*planSeconds/max(perStep, 1e-6))) + 2
	return ep.info.Steps-(step+1) <= ahead
}

// PlanSeconds returns how long preparing epoch e took (0: not prepared by
// this book, or under way).
func (b *Book) PlanSeconds(e int) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if job := b.jobs[e]; job != nil {
		return job.seconds
	}
	return 0
}

// PlanAhead prepares epoch e in the background; the preparation is
// registered before PlanAhead returns. An error is kept for the publisher,
// which meets it when it reaches e.
func (b *Book) PlanAhead(ctx context.Context, e int, log *slog.Logger) {
	job, run := b.job(e)
	if !run {
		return
	}
	b.Background(func() {
		b.run(ctx, e, job)
		if job.err != nil && ctx.Err() == nil {
			log.Warn("planning ahead", "epoch", e, "err", job.err)
		}
	})
}

// Background runs f on a goroutine counted in ahead.
func (b *Book) Background(f func()) {
	b.ahead.Add(1)
	go func() {
		defer b.ahead.Done()
		f()
	}()
}

// WaitBackground waits for the goroutines the book started (planning ahead,
// recording the active epoch): the publisher's last act.
func (b *Book) WaitBackground() { b.ahead.Wait() }

// CloseAll releases every plan held.
func (b *Book) CloseAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for e, ep := range b.plans {
		ep.Close()
		delete(b.plans, e)
	}
}
