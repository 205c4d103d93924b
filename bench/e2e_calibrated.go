package main

import (
	"fmt"

	"github.com/mmfeed/mmfeed/balancer"
)

// e2ePlanFeatures maps a plan step index to each dp rank's feature sum as the
// trainer computes it (balancer.Plan.RankFeatures: padded or packed).
type e2ePlanFeatures map[int][]balancer.Features

func planFeatures(p *balancer.Plan) e2ePlanFeatures {
	out := e2ePlanFeatures{}
	for _, s := range p.Steps {
		out[s.Index] = p.RankFeatures(s)
	}
	return out
}

// calibratedImbalance is the measured over predicted imbalance after calibration, fitted
// out of sample: the prior is refit (balancer.Calibrate, colocated, with a per-rank-step
// overhead) to one round's rank compute times and predicts the other round's steps, and
// the other way round. Measured and predicted are means over those steps of max / mean
// rank compute. It returns 0, 0 when there are fewer than two rounds or a fit fails.
func calibratedImbalance(prior balancer.CostModel, feats e2ePlanFeatures, rounds [][]e2eRow) (ratio, fitErr float64, err error) {
	if len(rounds) < 2 {
		return 0, 0, nil
	}
	var measured, predicted, relErr float64
	var steps, fits int
	for k := range rounds {
		var train []balancer.Observation
		for j, rows := range rounds {
			if j != k {
				o, err := observationsOf(feats, rows)
				if err != nil {
					return 0, 0, err
				}
				train = append(train, o...)
			}
		}
		cal, err := balancer.Calibrate(prior, train, balancer.CalibrateConfig{Placement: balancer.Colocated, FitOverhead: true})
		if err != nil {
			return 0, 0, fmt.Errorf("calibrate on %d rank-steps: %w", len(train), err)
		}
		relErr += cal.Fit.MeanRelErr
		fits++
		for _, row := range rounds[k] {
			f, ok := feats[row[0].Step]
			if !ok || len(f) != len(row) {
				return 0, 0, fmt.Errorf("step %d: no plan features for %d ranks", row[0].Step, len(row))
			}
			pred := make([]float64, len(row))
			meas := make([]float64, len(row))
			for r, s := range row {
				pred[r], meas[r] = cal.Predict(f[r], balancer.Colocated), s.ComputeS
			}
			if m, p := maxOverMean(meas), maxOverMean(pred); m > 0 && p > 0 {
				measured, predicted, steps = measured+m, predicted+p, steps+1
			}
		}
	}
	if steps == 0 || predicted == 0 {
		return 0, 0, nil
	}
	return measured / predicted, relErr / float64(fits), nil
}

// observationsOf pairs each rank-step's measured compute with its plan features.
func observationsOf(feats e2ePlanFeatures, rows []e2eRow) ([]balancer.Observation, error) {
	var out []balancer.Observation
	for _, row := range rows {
		f, ok := feats[row[0].Step]
		if !ok || len(f) != len(row) {
			return nil, fmt.Errorf("step %d: no plan features for %d ranks", row[0].Step, len(row))
		}
		for r, s := range row {
			if s.ComputeS > 0 {
				out = append(out, balancer.Observation{Features: f[r], Seconds: s.ComputeS})
			}
		}
	}
	return out, nil
}
