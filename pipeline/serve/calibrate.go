package serve

import (
	"context"
	"slices"
	"sync"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/proto"
)

// maxObservations bounds the rank-steps kept for calibration (the newest).
// Each dp rank keeps at most its share (maxObservations / dp), so one rank
// that floods feedback cannot push the others' measurements out.
const maxObservations = 4096

type obsKey struct{ epoch, step, dp int }

type obsAcc struct {
	seconds float64 // max over the dp rank's mp ranks
	mps     map[int]bool
}

// calibrator turns trainer feedback into cost-model observations: one per
// (epoch, step, dp rank) once every mp rank of the dp rank reported, with the
// slowest mp rank's compute time (the dp rank's step time) and the plan's
// feature sum of the rank's samples. A repeated report of the same (epoch,
// step, dp, mp) counts once, and a non-finite or implausible time is
// refused (balancer.Observation.Validate); the fit itself leaves outliers
// out and is checked (balancer.Calibrate), so a failed refit keeps the last
// good model.
type calibrator struct {
	mu      sync.Mutex
	mp, dp  int
	prior   balancer.CostModel
	cfg     balancer.CalibrateConfig
	minObs  int
	pending map[obsKey]*obsAcc
	done    map[obsKey]bool // keys already observed, pruned with pending
	byRank  [][]balancer.Observation
	obs     []balancer.Observation // the union of byRank, rebuilt on add
	refused int
	last    *balancer.Calibration
	lastAt  int // added when last was fitted
	fits    int // observations added when the planner last fitted
	added   int // observations added so far (also those since dropped)
	// shown is the report's fit: refit on demand from every observation,
	// whether or not the planner used it (the planner's fits are last/lastAt).
	shown  *balancer.Calibration
	shownN int
	// onFit, when set, gets every planner refit (costmodel.go writes --cost-model-out).
	onFit func(balancer.Calibration, int)
}

func newCalibrator(cfg Config) *calibrator {
	prior := cfg.Pipeline.Plan.Model
	if prior == (balancer.CostModel{}) {
		shape := balancer.TinyShape()
		prior, _ = balancer.NewCostModel(shape)
	}
	dp := max(cfg.Pipeline.Plan.DP, 1)
	return &calibrator{mp: cfg.MP, dp: dp, prior: prior, minObs: cfg.MinObservations,
		pending: map[obsKey]*obsAcc{}, done: map[obsKey]bool{}, byRank: make([][]balancer.Observation, dp),
		cfg: balancer.CalibrateConfig{Placement: cfg.Pipeline.Plan.Placement}}
}

// add records one feedback; feats is the dp rank's feature sum for that step.
// It reports whether the feedback was used (false: refused or a repeat).
func (c *calibrator) add(fb proto.Feedback, feats balancer.Features) bool {
	if (balancer.Observation{Features: feats, Seconds: fb.ComputeSeconds}).Validate() != nil ||
		fb.DPRank < 0 || fb.DPRank >= c.dp || fb.MPRank < 0 || fb.MPRank >= c.mp {
		c.mu.Lock()
		c.refused++
		c.mu.Unlock()
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := obsKey{fb.Epoch, fb.Step, fb.DPRank}
	a := c.pending[k]
	if c.done[k] || (a != nil && a.mps[fb.MPRank]) {
		return false
	}
	if a == nil {
		a = &obsAcc{mps: map[int]bool{}}
		c.pending[k] = a
	}
	a.seconds = max(a.seconds, fb.ComputeSeconds)
	a.mps[fb.MPRank] = true
	if len(a.mps) < c.mp {
		return true
	}
	delete(c.pending, k)
	c.done[k] = true
	r := &c.byRank[fb.DPRank]
	*r = append(*r, balancer.Observation{Features: feats, Seconds: a.seconds})
	if share := max(maxObservations/c.dp, 1); len(*r) > share {
		*r = (*r)[len(*r)-share:]
	}
	c.added++
	c.rebuild()
	if len(c.pending)+len(c.done) > 4*maxObservations { // forget keys far behind this one
		c.prune(fb.Epoch, fb.Step)
	}
	return true
}

// rebuild sets obs to the newest observations of every dp rank, at most
// twice the lower median of the ranks' counts (and at least 16) from each,
// so no rank outweighs the typical one more than twofold. Caller holds c.mu.
func (c *calibrator) rebuild() {
	counts := make([]int, len(c.byRank))
	for i, ro := range c.byRank {
		counts[i] = len(ro)
	}
	slices.Sort(counts)
	capN := max(2*counts[(len(counts)-1)/2], 16)
	c.obs = c.obs[:0]
	for _, ro := range c.byRank {
		c.obs = append(c.obs, ro[max(len(ro)-capN, 0):]...)
	}
}

// prune forgets pending and done keys of older epochs or more than 64 steps
// behind (epoch, step). Caller holds c.mu.
func (c *calibrator) prune(epoch, step int) {
	old := func(k obsKey) bool { return k.epoch < epoch || (k.epoch == epoch && k.step < step-64) }
	for k := range c.pending {
		if old(k) {
			delete(c.pending, k)
		}
	}
	for k := range c.done {
		if old(k) {
			delete(c.done, k)
		}
	}
}

// fit refits the model when enough observations arrived since the last fit.
func (c *calibrator) fit() (balancer.Calibration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.obs) < c.minObs || c.added == c.fits {
		return balancer.Calibration{}, false
	}
	c.fits = c.added
	cal, err := balancer.Calibrate(c.prior, c.obs, c.cfg)
	if err != nil { // the last good model stays
		return balancer.Calibration{}, false
	}
	c.last, c.lastAt = &cal, c.added
	if c.onFit != nil {
		c.onFit(cal, len(c.obs))
	}
	return cal, true
}

// model returns the latest fit's model, refitting first.
func (c *calibrator) model() (balancer.CostModel, bool) {
	if cal, ok := c.fit(); ok {
		return cal.Model, true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		return balancer.CostModel{}, false
	}
	return c.last.Model, true
}

// snapshot returns the fit of the cost model to every observation so far
// (nil before MinObservations) and the number of observations. It refits
// when observations arrived since the last snapshot, so the report shows the
// fit even after everything was published and the planner stopped refitting;
// the planner's own refits (fit, model) are unaffected.
func (c *calibrator) snapshot() (*balancer.Calibration, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.obs)
	if n >= c.minObs && c.added != c.shownN {
		if cal, err := balancer.Calibrate(c.prior, c.obs, c.cfg); err == nil {
			c.shown = &cal
		}
		c.shownN = c.added
	}
	latest := c.shown
	if c.last != nil && (latest == nil || c.lastAt > c.shownN) {
		latest = c.last
	}
	if latest == nil {
		return nil, n
	}
	cal := *latest
	return &cal, n
}

// recalibrateDue refits every Recalibrate published steps and, when the fit
// works, replans the unpublished rest of the epoch with it (epochs.Book.ReplanRest:
// the book changes and records the plan). It reports whether the run must
// restart on the new steps. Publisher goroutine only.
func (s *Service) recalibrateDue(ctx context.Context, ep *epochs.Plan, step int, queued []proto.Pos) bool {
	if s.cfg.Recalibrate <= 0 {
		return false
	}
	if !s.publisher.RecalibrationDue(s.cfg.Recalibrate, ep.Planned) {
		return false // not due, or the epoch is not planned whole: try again at the next step
	}
	cal, ok := s.cal.fit()
	if !ok {
		return false
	}
	e, fit := ep.Info().Epoch, cal.Fit
	seg := func(from int) Segment { return Segment{FromStep: from, Model: cal.Model, Fit: &fit} }
	from, replanned, err := s.epochs.ReplanRest(ctx, ep, step, queued, seg)
	switch {
	case err != nil:
		s.log.Warn("recalibration not recorded, plan kept", "err", err)
		return false
	case from < 0: // a later epoch is queued already
		return false
	case !replanned:
		s.log.Info("recalibration kept the plan (the replan would change the step count)", "epoch", e, "from_step", from)
		return false
	}
	s.met.recalibrations.Inc()
	s.log.Info("recalibrated", "epoch", e, "from_step", from, "r2", fit.R2, "mean_rel_err", fit.MeanRelErr, "observations", fit.N)
	return true
}

// Observations returns a copy of the observations, the prior, the fit
// configuration and the minimum count a fit needs (the live page's fit
// history takes them: report.Views' ObservationSource).
func (c *calibrator) Observations() ([]balancer.Observation, balancer.CostModel, balancer.CalibrateConfig, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]balancer.Observation(nil), c.obs...), c.prior, c.cfg, c.minObs
}
