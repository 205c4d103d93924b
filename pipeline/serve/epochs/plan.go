package epochs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
)

// Plan is one epoch prepared and planned: the base plan (the pure
// function of dataset, seed, epoch, layout and config that plan_hash names)
// and the steps actually served, which differ from the base plan's from each
// recalibration segment on.
type Plan struct {
	info Info
	job  string
	log  *slog.Logger
	// firstWindow is how long planning the first window took.
	firstWindow time.Duration
	// baselines: the report compares the plan with the other strategies
	// (Config.NoBaselines off).
	baselines bool
	// prep is the epoch's order of the job's dataset, which it shares
	// (owned is the dataset when the plan has its own: prepareEpoch).
	prep  *pipeline.Prepared
	owned *pipeline.Dataset
	qfile io.Closer
	// base is the base plan's configuration, items, dropped and rejected
	// samples, without steps (prog has the complete plan once planned).
	base *balancer.Plan
	// resized is the served plan after a resize (its Config has the new
	// dp); nil without one.
	resized *balancer.Plan
	// steps are the served steps (all of the epoch's, those from
	// prog.steps() on still zero); entries index prep.Features.Items.
	steps []balancer.Step
	// feats[step][dp] is the rank's padded feature sum (padding entries included).
	feats [][]balancer.Features
	// prog says how many steps are planned; the comparison report is there.
	prog *planning
}

// Config is what preparing an epoch needs of the service's
// configuration.
type Config struct {
	// Pipeline is the job's dataset, plan, tokenizer and image configuration
	// (Plan.Epoch is the job's first epoch; each epoch sets its own).
	Pipeline pipeline.Config
	// Job names the job (the background planner's hook and logs).
	Job string
	// Logger logs the planning (nil: slog.Default()).
	Logger *slog.Logger
	// QuarantineDir, when set, gets each epoch's quarantine-e<epoch>.jsonl.
	QuarantineDir string
	// NoBaselines leaves the other strategies out of the report's comparison.
	NoBaselines bool
}

// reportThumbnails is how many heaviest and how many extreme-aspect samples
// the report page shows.
const reportThumbnails = 6

// PrepareWhole opens the dataset for epoch alone (the plan owns it) and
// prepares the epoch from it (Prepare), waiting until it is planned to the
// end.
func PrepareWhole(ctx context.Context, cfg Config, epoch int, stored *Info, model balancer.CostModel) (*Plan, error) {
	ds, err := pipeline.OpenDataset(ctx, cfg.Pipeline, nil)
	if err != nil {
		return nil, fmt.Errorf("serve: prepare epoch %d: %w", epoch, err)
	}
	ep, err := Prepare(ctx, cfg, ds, epoch, stored, model, nil)
	if err != nil {
		ds.Close()
		return nil, err
	}
	ep.owned = ds
	if err := ep.prog.waitAll(ctx); err != nil {
		ep.Close()
		return nil, err
	}
	return ep, nil
}

// Prepare orders ds (the job's dataset, opened with cfg.Pipeline)
// for epoch and plans its first window with the model of stored's first
// segment (or model when stored is nil); the rest of the epoch and the
// strategy comparison are planned in the background (planning), unless
// stored has recalibration segments or a resize to replay, which need the
// whole plan first. Quarantined samples go to the epoch's file and, when
// qkv is not nil, to the job's quarantine bucket.
func Prepare(ctx context.Context, cfg Config, ds *pipeline.Dataset, epoch int, stored *Info, model balancer.CostModel, qkv *work.QuarantineSink) (*Plan, error) {
	pc := cfg.Pipeline
	pc.Plan.Epoch = epoch
	pc.Plan.Model = model
	if stored != nil {
		pc.Plan.Model = stored.Segments[0].Model
		if stored.DP > 0 {
			pc.Plan.DP = stored.DP // planned before a resize: replay at the dp it had
		}
	}
	qw, qfile, err := openQuarantine(cfg.QuarantineDir, epoch)
	if err != nil {
		return nil, err
	}
	if qkv != nil {
		qw = qkv.WithFile(qw)
	}
	prep, err := ds.Epoch(ctx, pc.Plan, qw)
	if err != nil {
		closeQuiet(qfile)
		return nil, fmt.Errorf("serve: prepare epoch %d: %w", epoch, err)
	}
	ep := &Plan{prep: prep, qfile: qfile, job: cfg.Job, log: cfg.Logger, baselines: !cfg.NoBaselines}
	if ep.log == nil {
		ep.log = slog.Default()
	}
	if err := ep.plan(ctx, stored); err != nil {
		ep.Close()
		return nil, err
	}
	return ep, nil
}

// plan starts the base plan (balancer.Start), plans its first window, which
// names it (plan_hash: balancer.Planner.Hash), and checks it against stored.
// The rest is planned in the background, or here when stored's segments
// must be replayed.
func (ep *Plan) plan(ctx context.Context, stored *Info) error {
	pc := ep.prep.Config.Plan
	pl, err := balancer.Start(ep.prep.Features.Items, pc)
	if err != nil {
		return fmt.Errorf("serve: plan epoch %d: %w", pc.Epoch, err)
	}
	head := *pl.Plan()
	head.Steps = nil
	ep.base = &head
	ep.quarantineRejected()
	n := pl.Steps()
	ep.steps, ep.feats, ep.prog = make([]balancer.Step, n), make([][]balancer.Features, n), newPlanning(n)
	if !pl.Done() {
		t0 := time.Now()
		if err := ep.planWindow(pl); err != nil {
			return err
		}
		ep.firstWindow = time.Since(t0)
	}
	ep.info = Info{Epoch: pc.Epoch, Steps: n, MicroBatches: pc.MicroBatches, PlanHash: pl.Hash(),
		Segments: []Segment{{FromStep: 0, Model: head.Config.Model}}, DP: pc.DP}
	ep.info.VocabSize, _ = pipeline.TokenizerMeta(ep.prep.Tokenizer)
	if stored == nil {
		ep.planInBackground(pl)
		return nil
	}
	if stored.PlanHash != ep.info.PlanHash || (stored.Steps != ep.info.Steps && stored.Resize == nil) {
		return fmt.Errorf("serve: epoch %d replans to hash %.12s (%d steps), the job recorded %.12s (%d steps): %w",
			pc.Epoch, ep.info.PlanHash, ep.info.Steps, stored.PlanHash, stored.Steps, work.ErrJobMismatch)
	}
	if len(stored.Segments) == 1 && stored.Resize == nil {
		ep.planInBackground(pl)
		return nil
	}
	if err := ep.planAll(ctx, pl); err != nil {
		return err
	}
	return ep.replay(stored)
}

// quarantineRejected records the samples the planner rejected (what
// pipeline.Prepared.Plan does for the plans it builds).
func (ep *Plan) quarantineRejected() {
	for _, r := range ep.base.Rejected {
		e := ep.prep.Features.Entry(int(r.Item))
		_ = ep.prep.Quarantine.Write(loader.Reject{ID: e.ID, Location: e.Location, Reason: "plan_rejected", Detail: r.Reason})
	}
}

// thumbnails returns the report's sample thumbnails of the complete plan.
func thumbnails(ctx context.Context, ep *Plan, whole *balancer.Plan) ([]balancer.Thumbnail, error) {
	return pipeline.Thumbnails(ctx, ep.prep, whole, reportThumbnails)
}

// compareStrategies reports the base plan against the baselines (none
// without baselines) without quarantining the planner's rejections a second
// time.
func compareStrategies(base *balancer.Plan, prep *pipeline.Prepared, baselines bool) (*balancer.Report, error) {
	plans := []*balancer.Plan{base}
	for _, s := range balancer.Strategies() {
		if s == base.Config.Strategy || !baselines {
			continue
		}
		c := base.Config
		c.Strategy = s
		p, err := balancer.Build(prep.Features.Items, c)
		if err != nil {
			return nil, fmt.Errorf("serve: baseline %v: %w", s, err)
		}
		plans = append(plans, p)
	}
	r, err := balancer.NewReport(plans...)
	if err != nil {
		return nil, err
	}
	r.Quarantined = int(prep.Quarantine.Total())
	r.Kept = pipeline.KeptReport(prep.Index)
	r.TextTruncation = prep.TextTruncation()
	return r, nil
}

// replay replays stored's recalibration segments and its resize, in the
// order they were recorded.
func (ep *Plan) replay(stored *Info) error {
	before := len(stored.Segments)
	if stored.Resize != nil {
		before = stored.Resize.Segments
	}
	for i, seg := range stored.Segments[1:] {
		if i+1 == before {
			if err := ep.resize(*stored.Resize); err != nil {
				return err
			}
		}
		if !ep.replan(seg) {
			return fmt.Errorf("serve: epoch %d: recorded recalibration at step %d does not replay: %w", stored.Epoch, seg.FromStep, ErrState)
		}
	}
	if stored.Resize != nil && before == len(stored.Segments) {
		return ep.resize(*stored.Resize)
	}
	return nil
}

// resize replaces the steps from r.FromStep on with a plan of their real
// samples for r.DP ranks (balancer.Plan.Resize) under the model in effect,
// and records it.
func (ep *Plan) resize(r ResizeSegment) error {
	served := *ep.served()
	served.Steps = ep.steps
	_, seg := ep.SegmentAt(r.FromStep)
	served.Config.Model = seg.Model
	p, err := served.Resize(r.FromStep, r.DP)
	if err != nil {
		return fmt.Errorf("serve: epoch %d: resize to dp %d from step %d: %w", ep.info.Epoch, r.DP, r.FromStep, err)
	}
	if len(p.Dropped) > len(served.Dropped) || len(p.Rejected) > len(served.Rejected) {
		return fmt.Errorf("serve: epoch %d: resize to dp %d from step %d drops %d and rejects %d samples (use tail padding): %w",
			ep.info.Epoch, r.DP, r.FromStep, len(p.Dropped)-len(served.Dropped), len(p.Rejected)-len(served.Rejected), ErrState)
	}
	ep.resized, ep.steps = p, p.Steps
	ep.info.Steps = len(p.Steps)
	ep.info.Resize = &r
	return nil
}

// served returns the plan the served steps follow: the base plan, or the
// resized one (whose configuration has the new dp). Its Steps are not
// the served ones (ep.steps), nor all of them while the epoch is planned.
func (ep *Plan) served() *balancer.Plan {
	if ep.resized != nil {
		return ep.resized
	}
	return ep.base
}

// Planned reports whether every step is planned (a recalibration or a
// resize replans the rest of the epoch, so it waits for this).
func (ep *Plan) Planned() bool {
	return ep.prog.steps() == len(ep.steps)
}

// replan replaces the steps from seg.FromStep on with a plan of their real
// samples under seg.Model (balancer.Plan.Replan), and records the segment.
// It keeps the old steps and reports false when the new plan would not have
// the same number of steps (global-tokens batches) or would drop or reject
// items.
func (ep *Plan) replan(seg Segment) bool {
	from := seg.FromStep
	if from >= len(ep.steps) || !ep.Planned() {
		return false
	}
	served := *ep.served()
	served.Steps = ep.steps
	p, err := served.Replan(from, seg.Model)
	if err != nil {
		return false
	}
	steps := p.Steps
	ep.steps = steps
	ep.info.Segments = append(ep.info.Segments, seg)
	if ep.feats != nil {
		for k := from; k < len(steps); k++ {
			ep.feats[k] = ep.stepFeatures(steps[k])
		}
	}
	return true
}

// stepFeatures sums each dp rank's padded feature vectors over a step: each micro-batch
// counts as its samples × (longest caption, largest image), which is what the trainer
// computes, so the calibration refits the cost the plan predicts.
func (ep *Plan) stepFeatures(s balancer.Step) []balancer.Features {
	return ep.base.RankFeatures(s)
}

// SegmentAt returns the segment in effect at step (its index and itself).
func (ep *Plan) SegmentAt(step int) (int, Segment) {
	i := len(ep.info.Segments) - 1
	for i > 0 && ep.info.Segments[i].FromStep > step {
		i--
	}
	return i, ep.info.Segments[i]
}

// PlanFrom returns the served steps from start on that are planned (none
// when start is not: wait on prog first) as a plan for the Preprocessor,
// with the model in effect at start (the rows' cost column).
func (ep *Plan) PlanFrom(start int) *balancer.Plan {
	q := *ep.served()
	q.Steps = ep.steps[start:max(start, ep.prog.steps())]
	_, seg := ep.SegmentAt(start)
	q.Config.Model = seg.Model
	return &q
}

// Predicted returns the step's per-dp-rank cost under the model in effect.
func (ep *Plan) Predicted(step int) []float64 {
	_, seg := ep.SegmentAt(step)
	pl := ep.prep.Config.Plan.Placement
	out := make([]float64, len(ep.feats[step]))
	for r, f := range ep.feats[step] {
		out[r] = pl.StepCost(seg.Model.CostOf(f))
	}
	return out
}

// Close stops the background planner and releases the epoch's order, its
// own dataset (PrepareWhole) and quarantine file.
func (ep *Plan) Close() {
	if ep.prog != nil {
		ep.prog.stop()
	}
	if ep.prep != nil {
		_ = ep.prep.Close()
	}
	if ep.owned != nil {
		_ = ep.owned.Close()
	}
	closeQuiet(ep.qfile)
}

func openQuarantine(dir string, epoch int) (io.Writer, io.Closer, error) {
	if dir == "" {
		return nil, nil, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("serve: quarantine dir: %w", err)
	}
	f, err := loader.OpenQuarantineFile(filepath.Join(dir, fmt.Sprintf("quarantine-e%d.jsonl", epoch)))
	if err != nil {
		return nil, nil, fmt.Errorf("serve: %w", err)
	}
	return f, f, nil // each sample once, across restarts and re-plans
}

func closeQuiet(c io.Closer) {
	if c != nil {
		_ = c.Close()
	}
}

// Info returns the epoch's info as the plan holds it (a recalibration
// changes it from the publisher's goroutine: Book.ReplanRest).
func (ep *Plan) Info() Info { return ep.info }

// Prepared returns the epoch's order of the job's dataset (its features,
// tokenizer, quarantine and preprocessing configuration).
func (ep *Plan) Prepared() *pipeline.Prepared { return ep.prep }

// StepFeatures returns each dp rank's padded feature sum of a planned step
// (the plan's own slice: callers that keep it clone it).
func (ep *Plan) StepFeatures(step int) []balancer.Features { return ep.feats[step] }

// ServedSteps returns the served steps (those not planned yet are zero).
func (ep *Plan) ServedSteps() []balancer.Step { return ep.steps }

// WaitPlanned returns once the first n steps are planned (planning.wait).
func (ep *Plan) WaitPlanned(ctx context.Context, n int) error { return ep.prog.wait(ctx, n) }

// Planning returns the steps planned, the epoch's steps, the strategy
// comparison (nil until built) and why the planning failed (planning.state);
// all zero for a plan that is not planned yet.
func (ep *Plan) Planning() (planned, total int, report *balancer.Report, err error) {
	if ep.prog == nil {
		return 0, 0, nil, nil
	}
	return ep.prog.state()
}

// MixtureReport returns the mixture's per-source lines of the complete base
// plan (nil until built, and for a plain input).
func (ep *Plan) MixtureReport() *pipeline.MixtureReport { return ep.prog.mixtureReport() }

// FirstWindow is how long planning the first window took.
func (ep *Plan) FirstWindow() time.Duration { return ep.firstWindow }
