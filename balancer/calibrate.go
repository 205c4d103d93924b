package balancer

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
)

// Observation is one measured rank-step: the feature sums of the samples the
// rank processed (padding entries included) and the measured seconds.
type Observation struct {
	Features Features `json:"features"`
	Seconds  float64  `json:"seconds"`
}

// Bounds of a plausible observation: a rank-step longer than a day, or a
// feature sum beyond MaxObservationFeature, is a broken clock or a forged
// message, not a measurement.
const (
	MaxObservationSeconds = 86400
	MaxObservationFeature = 1e18
)

// Validate checks that the features are finite, non-negative and at most
// MaxObservationFeature, and the time positive and at most
// MaxObservationSeconds.
func (o Observation) Validate() error {
	for f, v := range o.Features {
		if !(v >= 0 && v <= MaxObservationFeature) {
			return fmt.Errorf("balancer: observation feature %v = %v: %w", Feature(f), v, ErrMalformed)
		}
	}
	if !(o.Seconds > 0 && o.Seconds <= MaxObservationSeconds) {
		return fmt.Errorf("balancer: observation seconds %v: %w", o.Seconds, ErrMalformed)
	}
	return nil
}

// MaxObservationLine bounds one line of ReadObservations' input.
const MaxObservationLine = 1 << 16

// ReadObservations parses JSON lines {"features":[L,L²,P,P²,LP,complexity,n],
// "seconds":t}; blank lines are skipped. Errors wrap ErrMalformed and name the
// line.
func ReadObservations(r io.Reader) ([]Observation, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), MaxObservationLine)
	var out []Observation
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(trimSpace(b)) == 0 {
			continue
		}
		var raw struct {
			Features []float64 `json:"features"`
			Seconds  float64   `json:"seconds"`
		}
		if err := json.Unmarshal(b, &raw); err != nil {
			return nil, fmt.Errorf("balancer: observation line %d: %v: %w", line, err, ErrMalformed)
		}
		if len(raw.Features) != int(NumFeatures) {
			return nil, fmt.Errorf("balancer: observation line %d: %d features, want %d: %w", line, len(raw.Features), NumFeatures, ErrMalformed)
		}
		o := Observation{Seconds: raw.Seconds}
		copy(o.Features[:], raw.Features)
		if err := o.Validate(); err != nil {
			return nil, fmt.Errorf("balancer: observation line %d: %w", line, err)
		}
		out = append(out, o)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("balancer: observations: %v: %w", err, ErrMalformed)
	}
	return out, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}

// CalibrateConfig configures Calibrate.
type CalibrateConfig struct {
	// Placement the observations were measured under.
	Placement Placement `json:"placement"`
	// FitOverhead also fits a constant per rank-step overhead (seconds).
	FitOverhead bool `json:"fit_overhead"`
}

// Fit is a model's fit quality on observations.
type Fit struct {
	N int `json:"n"`
	// R2 is 1 − SS_res / SS_tot.
	R2 float64 `json:"r2"`
	// MeanRelErr is mean |predicted − measured| / measured.
	MeanRelErr float64 `json:"mean_rel_err"`
}

// Calibration is the result of Calibrate.
type Calibration struct {
	// Model has the refit coefficients, unit seconds.
	Model CostModel `json:"model"`
	// Overhead is the fitted constant per rank-step (0 unless FitOverhead).
	Overhead float64 `json:"overhead"`
	// Fit is the calibrated model's quality on the observations.
	Fit Fit `json:"fit"`
	// Prior is the prior model's quality after the best single scale factor
	// (units differ: GFLOP versus seconds).
	Prior Fit `json:"prior"`
	// Outliers counts the observations left out of the fit (see
	// Calibrate).
	Outliers int `json:"outliers,omitempty"`
}

// Predict returns the calibrated step seconds of a rank with feature sums f.
func (c Calibration) Predict(f Features, pl Placement) float64 {
	return pl.StepCost(c.Model.CostOf(f)) + c.Overhead
}

// ownerOf is the component that takes a feature's coefficient when the prior
// has none for it. FeatComplexity has no owner: the GPU cost has no term for
// it (see gpuFeature).
var ownerOf = [NumFeatures]Component{Text, Text, Vision, Vision, Fusion, Fusion, Fusion}

// Calibrate refits the prior's coefficients to measured rank-step times by
// non-negative least squares (Lawson–Hanson). Colocated fits one coefficient
// per feature and splits it over the components in the prior's proportions
// (only the sum is observable). Modality fits the two towers' step models,
// alternating between fixing which tower is the larger per observation and
// refitting (calibrate_modality.go). No coefficient of image complexity is
// fitted in either: the GPU cost has none (gpuFeature).
//
// Calibrate is robust to a minority of poisoned observations: those whose
// seconds per unit of prior cost are more than OutlierFactor away from the
// median are left out (counted in Outliers), and the refit is checked
// (finite, non-negative, predicting no worse than the rescaled prior);
// a refit that fails the check is an error wrapping ErrBadFit, so the caller
// keeps its last good model.
func Calibrate(prior CostModel, obs []Observation, cfg CalibrateConfig) (Calibration, error) {
	if err := prior.Validate(); err != nil {
		return Calibration{}, err
	}
	for i, o := range obs {
		if err := o.Validate(); err != nil {
			return Calibration{}, fmt.Errorf("balancer: observation %d: %w", i, err)
		}
	}
	all := len(obs)
	obs = dropOutliers(prior, obs, cfg.Placement)
	if len(obs) < int(NumFeatures)+1 {
		return Calibration{}, fmt.Errorf("balancer: calibrate with %d usable observations (of %d), want ≥ %d: %w", len(obs), all, NumFeatures+1, ErrNoObservations)
	}
	out, err := calibrate(prior, obs, cfg)
	if err != nil {
		return Calibration{}, err
	}
	out.Outliers = all - len(obs)
	return out, nil
}

func calibrate(prior CostModel, obs []Observation, cfg CalibrateConfig) (Calibration, error) {
	var out Calibration
	out.Prior = priorFit(prior, obs, cfg.Placement)
	if cfg.Placement == Modality {
		out.Model, out.Overhead = fitModality(prior, obs, cfg.FitOverhead)
	} else {
		out.Model, out.Overhead = fitColocated(prior, obs, cfg.FitOverhead)
	}
	out.Model.Unit = "s"
	out.Fit = fitQuality(obs, func(f Features) float64 { return out.Predict(f, cfg.Placement) })
	return out, out.check()
}

// fitColocated fits one coefficient per GPU feature (only the sum of the
// components is observable) and splits it over the components in the
// prior's proportions, or gives it to ownerOf where the prior has none.
func fitColocated(prior CostModel, obs []Observation, overhead bool) (CostModel, float64) {
	feats := gpuFeatures()
	rows := make([][]float64, len(obs))
	y := make([]float64, len(obs))
	for i, o := range obs {
		rows[i] = make([]float64, len(feats)+1)
		for k, f := range feats {
			rows[i][k] = o.Features[f]
		}
		if overhead {
			rows[i][len(feats)] = 1
		}
		y[i] = o.Seconds
	}
	theta := nnlsScaled(rows, y)
	var m CostModel
	for k, f := range feats {
		var s float64
		for c := range NumComponents {
			s += prior.Coef[c][f]
		}
		if s == 0 {
			m.Coef[ownerOf[f]][f] = theta[k]
			continue
		}
		for c := range NumComponents {
			m.Coef[c][f] = theta[k] * prior.Coef[c][f] / s
		}
	}
	return m, theta[len(feats)]
}

func priorFit(prior CostModel, obs []Observation, pl Placement) Fit {
	var num, den float64
	for _, o := range obs {
		p := pl.StepCost(prior.CostOf(o.Features))
		num += p * o.Seconds
		den += p * p
	}
	scale := 0.0
	if den > 0 {
		scale = num / den
	}
	return fitQuality(obs, func(f Features) float64 { return scale * pl.StepCost(prior.CostOf(f)) })
}

func fitQuality(obs []Observation, predict func(Features) float64) Fit {
	fit := Fit{N: len(obs)}
	var mean float64
	for _, o := range obs {
		mean += o.Seconds
	}
	mean /= float64(len(obs))
	var res, tot float64
	for _, o := range obs {
		p := predict(o.Features)
		res += (o.Seconds - p) * (o.Seconds - p)
		tot += (o.Seconds - mean) * (o.Seconds - mean)
		fit.MeanRelErr += math.Abs(p-o.Seconds) / o.Seconds
	}
	fit.MeanRelErr /= float64(len(obs))
	fit.R2 = 1
	if tot > 0 {
		fit.R2 = 1 - res/tot
	}
	return fit
}
