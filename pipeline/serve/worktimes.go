package serve

import (
	"fmt"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/prometheus/client_golang/prometheus"
)

// workTally compares predicted with measured item times over an epoch.
type workTally struct {
	n                             int
	predicted, measured, absError float64
}

// observe records one item's measured time against its prediction (made
// before this item is fitted), and fits the cost model to it. The caller
// holds w.mu.
func (w *workPlanner) observe(cost balancer.WorkCost, secs float64) {
	if secs <= 0 {
		return
	}
	if w.model.Fitted() {
		pred := w.model.Predict(cost)
		w.tally.add(pred, secs)
		w.total.add(pred, secs)
	}
	w.model.Observe(cost, secs)
}

func (t *workTally) add(pred, secs float64) {
	t.n++
	t.predicted += pred
	t.measured += secs
	t.absError += abs(pred - secs)
}

// WorkTimes compares the predicted with the measured time of batch items,
// and says how fast the workers computed features.
type WorkTimes struct {
	// FeatureEntries and FeatureSeconds: the entries of the feature passes
	// the workers did (not those from the cache), and their wall time.
	FeatureEntries int     `json:"feature_entries"`
	FeatureSeconds float64 `json:"feature_seconds"`
	// Items is how many items were timed after the first (which has no
	// prediction).
	Items int `json:"items"`
	// PredictedMS, MeasuredMS and AbsErrorMS are per-item means.
	PredictedMS float64 `json:"predicted_ms"`
	MeasuredMS  float64 `json:"measured_ms"`
	AbsErrorMS  float64 `json:"abs_error_ms"`
	// CostMS is the fitted cost model: milliseconds per unit of each
	// dimension of an item's cost (balancer.WorkCostNames).
	CostMS map[string]float64 `json:"cost_ms,omitempty"`
}

// WorkTimes returns the planner's predicted against measured item times
// over the job so far (zero with role all).
func (s *Service) WorkTimes() WorkTimes {
	if s.work == nil {
		return WorkTimes{}
	}
	s.work.mu.Lock()
	t := s.work.total
	wt := WorkTimes{FeatureEntries: s.work.featureEntries, FeatureSeconds: s.work.featureSeconds}
	if s.work.model.Fitted() {
		wt.CostMS = map[string]float64{}
		for i, dim := range balancer.WorkCostNames {
			wt.CostMS[dim] = 1e3 * s.work.model.Coefficients()[i]
		}
	}
	s.work.mu.Unlock()
	if t.n > 0 {
		n := float64(t.n)
		wt.Items, wt.PredictedMS, wt.MeasuredMS, wt.AbsErrorMS = t.n, 1e3*t.predicted/n, 1e3*t.measured/n, 1e3*t.absError/n
	}
	return wt
}

// registerTimes puts the predicted against measured item times on
// /metrics: their sums over the timed items (the mean is sum / count), and
// the fitted cost model's coefficients.
func (w *workPlanner) registerTimes(reg prometheus.Registerer) error {
	read := func(f func(t workTally) float64) func() float64 {
		return func() float64 {
			w.mu.Lock()
			defer w.mu.Unlock()
			return f(w.total)
		}
	}
	for kind, f := range map[string]func(workTally) float64{
		"predicted": func(t workTally) float64 { return t.predicted },
		"measured":  func(t workTally) float64 { return t.measured },
		"abs_error": func(t workTally) float64 { return t.absError },
	} {
		if err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mmfeed_serve_work_item_seconds_total",
			Help: "Planner: the predicted and measured worker seconds of the timed batch items, and their absolute difference, summed.", ConstLabels: prometheus.Labels{"kind": kind}},
			read(f))); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	if err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mmfeed_serve_work_items_timed_total",
		Help: "Planner: batch items whose worker time was compared with the prediction."},
		read(func(t workTally) float64 { return float64(t.n) }))); err != nil {
		return fmt.Errorf("serve: metrics: %w", err)
	}
	for i, dim := range balancer.WorkCostNames {
		if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mmfeed_serve_work_cost_seconds",
			Help: "Planner: the fitted worker seconds per unit of a batch item's cost: per megapixel of JPEG or of other formats, per encoded megabyte, per sample.", ConstLabels: prometheus.Labels{"per": dim}},
			func() float64 {
				w.mu.Lock()
				defer w.mu.Unlock()
				return w.model.Coefficients()[i]
			})); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	return nil
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// logTally logs the predicted against the measured item times of the epoch
// and starts a new tally.
func (w *workPlanner) logTally(epoch int) {
	w.mu.Lock()
	t := w.tally
	w.tally = workTally{}
	w.mu.Unlock()
	if t.n == 0 {
		return
	}
	w.mu.Lock()
	coef := w.model.Coefficients()
	w.mu.Unlock()
	w.log.Info("work items", "epoch", epoch, "items", t.n, "predicted_ms_mean", 1e3*t.predicted/float64(t.n),
		"measured_ms_mean", 1e3*t.measured/float64(t.n), "abs_error_ms_mean", 1e3*t.absError/float64(t.n),
		"ms_per_jpeg_mp", 1e3*coef[balancer.WorkJPEGMP], "ms_per_other_mp", 1e3*coef[balancer.WorkOtherMP],
		"ms_per_mb", 1e3*coef[balancer.WorkMB], "ms_per_sample", 1e3*coef[balancer.WorkSamples])
}
