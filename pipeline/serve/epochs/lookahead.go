package epochs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline"
)

// planning is the progress of an epoch's plan: the first window is planned
// before the epoch's info is known, the rest by one background goroutine,
// window after window, while the publisher serves the steps planned so far.
//
// The goroutine fills ep.steps[k] and ep.feats[k] for the window's steps and
// then raises planned under mu: a reader that saw planned > k (wait,
// planned) may read step k without another lock. Once every step is
// planned the goroutine builds the strategy comparison (report) and
// returns; nothing else of the plan changes behind the readers' backs.
type planning struct {
	mu      sync.Mutex
	total   int
	planned int
	whole   *balancer.Plan   // the base plan, once every step is planned
	report  *balancer.Report // the comparison, once built
	err     error            // why the background planning stopped
	changed chan struct{}    // closed and replaced whenever the above change
	cancel  context.CancelFunc
	done    chan struct{} // closed when the goroutine returned; nil: none started

	// mixture is a mixture's per-source lines, set with report (mixture.go).
	mixture *pipeline.MixtureReport
}

func newPlanning(total int) *planning {
	return &planning{total: total, changed: make(chan struct{})}
}

// notifyLocked wakes the waiters.
func (g *planning) notifyLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// advance records that the first n steps are planned.
func (g *planning) advance(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.planned = n
	g.notifyLocked()
}

// finish records the complete base plan and its comparison.
func (g *planning) finish(whole *balancer.Plan, report *balancer.Report) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.whole, g.report = whole, report
	g.notifyLocked()
}

// fail records why planning stopped.
func (g *planning) fail(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.err = err
	g.notifyLocked()
}

// state returns the steps planned, the epoch's steps, the comparison (nil
// until built) and the planning's failure.
func (g *planning) state() (planned, total int, report *balancer.Report, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.planned, g.total, g.report, g.err
}

// steps returns the number of steps planned.
func (g *planning) steps() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.planned
}

// wait returns once the first n steps are planned (n is clamped to the
// epoch's steps), or with the planning's failure or ctx's error.
func (g *planning) wait(ctx context.Context, n int) error {
	return g.waitFor(ctx, func() bool { return g.planned >= min(n, g.total) })
}

// waitAll returns once the plan and its comparison are complete.
func (g *planning) waitAll(ctx context.Context) error {
	return g.waitFor(ctx, func() bool { return g.report != nil })
}

func (g *planning) waitFor(ctx context.Context, ready func() bool) error {
	for {
		g.mu.Lock()
		ok, err, ch := ready(), g.err, g.changed
		g.mu.Unlock()
		switch {
		case ok:
			return nil
		case err != nil:
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// stop cancels the background planning and waits for it.
func (g *planning) stop() {
	if g.done == nil {
		return
	}
	g.cancel()
	<-g.done
}

// planWindowHook, when set, is called by the background planner before
// each window with the job and the steps planned (tests slow planning
// down with it).
var planWindowHook atomic.Pointer[func(job string, planned int)]

// SetPlanWindowHook makes h the hook the background planners call before
// each window after the first, with the job and the steps planned (nil:
// none); tests slow planning down with it.
func SetPlanWindowHook(h func(job string, planned int)) {
	if h == nil {
		planWindowHook.Store(nil)
		return
	}
	planWindowHook.Store(&h)
}

// planWindow plans the next window of pl into ep.steps and ep.feats and
// raises the watermark.
func (ep *Plan) planWindow(pl *balancer.Planner) error {
	from := pl.Planned()
	if _, err := pl.PlanNext(); err != nil {
		return fmt.Errorf("serve: plan epoch %d: %w", ep.prep.Config.Plan.Epoch, err)
	}
	steps := pl.Plan().Steps
	for k := from; k < len(steps); k++ {
		ep.steps[k] = steps[k]
		ep.feats[k] = ep.stepFeatures(steps[k])
	}
	ep.prog.advance(len(steps))
	return nil
}

// planAll plans every window left and builds the comparison.
func (ep *Plan) planAll(ctx context.Context, pl *balancer.Planner) error {
	for !pl.Done() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if h := planWindowHook.Load(); h != nil {
			(*h)(ep.job, pl.Planned())
		}
		if err := ep.planWindow(pl); err != nil {
			return err
		}
	}
	ep.log.Info("planned every step", "epoch", ep.prep.Config.Plan.Epoch, "steps", pl.Steps(), "windows", pl.Windows())
	return ep.compare(ctx, pl.Plan())
}

// compare builds the strategy comparison of the complete base plan, with
// its thumbnails, and records both.
func (ep *Plan) compare(ctx context.Context, whole *balancer.Plan) error {
	rep, err := compareStrategies(whole, ep.prep, ep.baselines)
	if err != nil {
		return err
	}
	// pipeline.Thumbnails reads images; the plan is complete without them.
	if rep.Thumbnails, err = thumbnails(ctx, ep, whole); err != nil {
		return err
	}
	ep.prog.setMixture(ep.prep.MixtureReport(whole))
	ep.prog.finish(whole, rep)
	return nil
}

// planInBackground plans the rest of pl on a goroutine that ep.close stops.
func (ep *Plan) planInBackground(pl *balancer.Planner) {
	ctx, cancel := context.WithCancel(context.Background())
	ep.prog.cancel, ep.prog.done = cancel, make(chan struct{})
	t0, epoch := time.Now(), ep.info.Epoch // ep.info is the publisher's once the plan is complete
	go func() {
		defer close(ep.prog.done)
		if err := ep.planAll(ctx, pl); err != nil {
			ep.prog.fail(err)
			if ctx.Err() == nil {
				ep.log.Error("planning", "epoch", epoch, "err", err)
			}
			return
		}
		ep.log.Info("planned epoch to the end, with the strategy comparison", "epoch", epoch, "steps", pl.Steps(), "windows", pl.Windows(),
			"seconds", time.Since(t0).Seconds())
	}()
}
