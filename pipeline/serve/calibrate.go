package serve

import (
	"context"
	"strconv"
	"sync"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/proto"
)

// maxObservations bounds the rank-steps kept for calibration (the newest).
const maxObservations = 4096

type obsKey struct{ epoch, step, dp int }

type obsAcc struct {
	seconds float64 // max over the dp rank's mp ranks
	reports int
}

// calibrator turns trainer feedback into cost-model observations: one per
// (epoch, step, dp rank) once every mp rank of the dp rank reported, with the
// slowest mp rank's compute time (the dp rank's step time) and the plan's
// feature sum of the rank's samples.
type calibrator struct {
	mu      sync.Mutex
	mp      int
	prior   balancer.CostModel
	cfg     balancer.CalibrateConfig
	minObs  int
	pending map[obsKey]*obsAcc
	obs     []balancer.Observation
	last    *balancer.Calibration
	fitN    int // observations the last fit used
	// shown is the report's fit: refit on demand from every observation,
	// whether or not the planner used it (the planner's fits are last/fitN).
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
	return &calibrator{mp: cfg.MP, prior: prior, minObs: cfg.MinObservations, pending: map[obsKey]*obsAcc{},
		cfg: balancer.CalibrateConfig{Placement: cfg.Pipeline.Plan.Placement}}
}

// add records one feedback; feats is the dp rank's feature sum for that step.
func (c *calibrator) add(fb proto.Feedback, feats balancer.Features) {
	if !(fb.ComputeSeconds > 0) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := obsKey{fb.Epoch, fb.Step, fb.DPRank}
	a := c.pending[k]
	if a == nil {
		a = &obsAcc{}
		c.pending[k] = a
	}
	a.seconds = max(a.seconds, fb.ComputeSeconds)
	a.reports++
	if a.reports < c.mp {
		return
	}
	delete(c.pending, k)
	c.obs = append(c.obs, balancer.Observation{Features: feats, Seconds: a.seconds})
	if len(c.obs) > maxObservations {
		c.obs = c.obs[len(c.obs)-maxObservations:]
	}
	if len(c.pending) > maxObservations { // ranks that never report: forget the oldest
		for key := range c.pending {
			if key.epoch < fb.Epoch || (key.epoch == fb.Epoch && key.step < fb.Step-64) {
				delete(c.pending, key)
			}
		}
	}
}

// fit refits the model when enough observations arrived since the last fit.
func (c *calibrator) fit() (balancer.Calibration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.obs) < c.minObs || len(c.obs) == c.fitN {
		return balancer.Calibration{}, false
	}
	cal, err := balancer.Calibrate(c.prior, c.obs, c.cfg)
	if err != nil {
		return balancer.Calibration{}, false
	}
	c.last, c.fitN = &cal, len(c.obs)
	if c.onFit != nil {
		c.onFit(cal, c.fitN)
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
	if n >= c.minObs && n != c.shownN {
		if cal, err := balancer.Calibrate(c.prior, c.obs, c.cfg); err == nil {
			c.shown, c.shownN = &cal, n
		}
	}
	latest := c.shown
	if c.last != nil && (latest == nil || c.fitN > c.shownN) {
		latest = c.last
	}
	if latest == nil {
		return nil, n
	}
	cal := *latest
	return &cal, n
}

// recalibrateDue refits every Recalibrate published steps and, when the fit
// works, replans the unpublished rest of the epoch with it. It reports
// whether the run must restart on the new steps. Publisher goroutine only.
func (s *Service) recalibrateDue(ep *epochPlan, step int, queued []pos) bool {
	if s.cfg.Recalibrate <= 0 {
		return false
	}
	s.sinceCal++
	if s.sinceCal < s.cfg.Recalibrate {
		return false
	}
	s.sinceCal = 0
	cal, ok := s.cal.fit()
	if !ok {
		return false
	}
	e := ep.info.Epoch
	s.mu.Lock()
	from := step + 1 // after every step queued or published
	for _, q := range queued {
		if q.Epoch > e {
			s.mu.Unlock()
			return false
		}
		if q.Epoch == e {
			from = max(from, q.Step)
		}
	}
	oldSteps, oldInfo := ep.steps, ep.info
	fit := cal.Fit
	replanned := ep.replan(Segment{FromStep: from, Model: cal.Model, Fit: &fit})
	info := ep.info
	s.mu.Unlock()
	if !replanned {
		s.log.Info("recalibration kept the plan (the replan would change the step count)", "epoch", e, "from_step", from)
		return false
	}
	if err := s.st.putJSON(context.Background(), kvEpochInfo+strconv.Itoa(e), info); err != nil {
		s.mu.Lock()
		ep.steps, ep.info = oldSteps, oldInfo
		for k := from; k < len(oldSteps); k++ {
			ep.feats[k] = ep.stepFeatures(oldSteps[k])
		}
		s.mu.Unlock()
		s.log.Warn("recalibration not recorded, plan kept", "err", err)
		return false
	}
	s.mu.Lock()
	s.infos[e] = info
	s.mu.Unlock()
	s.met.recalibrations.Inc()
	s.log.Info("recalibrated", "epoch", e, "from_step", from, "r2", fit.R2, "mean_rel_err", fit.MeanRelErr, "observations", fit.N)
	return true
}
