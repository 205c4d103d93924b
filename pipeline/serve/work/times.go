package work

import (
	"github.com/mmfeed/mmfeed/balancer"
)

// Tally compares predicted with measured item times: N items timed, the
// sums of their predicted and measured seconds and of the absolute
// difference.
type Tally struct {
	N                             int
	Predicted, Measured, AbsError float64
}

// observe records one item's measured time against its prediction (made
// before this item is fitted), and fits the cost model to it. The caller
// holds w.mu.
func (w *Planner) observe(cost balancer.WorkCost, secs float64) {
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

func (t *Tally) add(pred, secs float64) {
	t.N++
	t.Predicted += pred
	t.Measured += secs
	t.AbsError += abs(pred - secs)
}

// Times compares the predicted with the measured time of batch items,
// and says how fast the workers computed features.
type Times struct {
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

// Times returns the predicted against measured item times over the job
// so far.
func (w *Planner) Times() Times {
	w.mu.Lock()
	t := w.total
	wt := Times{FeatureEntries: w.featureEntries, FeatureSeconds: w.featureSeconds}
	if w.model.Fitted() {
		wt.CostMS = map[string]float64{}
		for i, dim := range balancer.WorkCostNames {
			wt.CostMS[dim] = 1e3 * w.model.Coefficients()[i]
		}
	}
	w.mu.Unlock()
	if t.N > 0 {
		n := float64(t.N)
		wt.Items, wt.PredictedMS, wt.MeasuredMS, wt.AbsErrorMS = t.N, 1e3*t.Predicted/n, 1e3*t.Measured/n, 1e3*t.AbsError/n
	}
	return wt
}

// Total returns the predicted against measured item times over the job so
// far, summed.
func (w *Planner) Total() Tally {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.total
}

// CostCoefficients returns the cost model's worker seconds per unit of
// each dimension of an item's cost (balancer.WorkCostNames): the fit to the
// workers' times, the prior before any.
func (w *Planner) CostCoefficients() balancer.WorkCost {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.model.Coefficients()
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// LogTally logs the predicted against the measured item times of the epoch
// and starts a new tally.
func (w *Planner) LogTally(epoch int) {
	w.mu.Lock()
	t := w.tally
	w.tally = Tally{}
	w.mu.Unlock()
	if t.N == 0 {
		return
	}
	w.mu.Lock()
	coef := w.model.Coefficients()
	w.mu.Unlock()
	w.log.Info("work items", "epoch", epoch, "items", t.N, "predicted_ms_mean", 1e3*t.Predicted/float64(t.N),
		"measured_ms_mean", 1e3*t.Measured/float64(t.N), "abs_error_ms_mean", 1e3*t.AbsError/float64(t.N),
		"ms_per_jpeg_mp", 1e3*coef[balancer.WorkJPEGMP], "ms_per_other_mp", 1e3*coef[balancer.WorkOtherMP],
		"ms_per_mb", 1e3*coef[balancer.WorkMB], "ms_per_sample", 1e3*coef[balancer.WorkSamples])
}
