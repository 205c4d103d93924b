package balancer

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// TestCalibratePoisoned: absurd observations are refused, a poisoned
// minority is left out and the fit still recovers the truth, and a refit
// that cannot be trusted is an error (the caller keeps its model).
func TestCalibratePoisoned(t *testing.T) {
	truth, _ := NewCostModel(TinyShape())
	for c := range NumComponents {
		truth.Coef[c] = truth.Coef[c].Scale(1e-3)
	}
	clean := observations(200, truth, Colocated, 0, 0.01, 3)
	poison := func(seconds float64, n int) []Observation {
		obs := append([]Observation(nil), clean...)
		for i := range n {
			obs[i*7].Seconds = seconds
		}
		return obs
	}
	tests := []struct {
		name     string
		obs      []Observation
		wantErr  error
		outliers int
	}{
		{"1e308 seconds refused", poison(1e308, 1), ErrMalformed, 0},
		{"infinite refused", poison(math.Inf(1), 1), ErrMalformed, 0},
		{"16 rank-steps of a day left out", poison(86400, 16), nil, 16},
		{"16 rank-steps of a nanosecond left out", poison(1e-9, 16), nil, 16},
		{"clean", clean, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cal, err := Calibrate(truth, tt.obs, CalibrateConfig{})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("got %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cal.Outliers != tt.outliers {
				t.Errorf("outliers %d, want %d", cal.Outliers, tt.outliers)
			}
			if cal.Fit.MeanRelErr > 0.02 {
				t.Errorf("fit %+v, want error ≤ 2%%", cal.Fit)
			}
		})
	}
}

func TestCalibrationCheck(t *testing.T) {
	good := Calibration{Fit: Fit{N: 10, R2: 0.9, MeanRelErr: 0.1}, Prior: Fit{N: 10, MeanRelErr: 0.2}}
	bad := []func(*Calibration){
		func(c *Calibration) { c.Model.Coef[Text][FeatL] = math.NaN() },
		func(c *Calibration) { c.Model.Coef[Text][FeatL] = -1 },
		func(c *Calibration) { c.Overhead = math.Inf(1) },
		func(c *Calibration) { c.Fit.MeanRelErr = math.NaN() },
		func(c *Calibration) { c.Fit.MeanRelErr = 0.9 }, // far worse than the prior's 0.2
	}
	if err := good.check(); err != nil {
		t.Fatalf("good calibration refused: %v", err)
	}
	for i, mutate := range bad {
		c := good
		mutate(&c)
		if err := c.check(); !errors.Is(err, ErrBadFit) {
			t.Errorf("case %d: got %v, want ErrBadFit", i, err)
		}
	}
}

// checkCalibration calibrates and checks the result is an expected error or
// a model that plans: valid coefficients and finite predictions.
func checkCalibration(t *testing.T, prior CostModel, obs []Observation, cfg CalibrateConfig) {
	t.Helper()
	cal, err := Calibrate(prior, obs, cfg)
	if err != nil {
		if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrNoObservations) && !errors.Is(err, ErrBadFit) {
			t.Fatalf("unexpected error %v", err)
		}
		return
	}
	if err := cal.Model.Validate(); err != nil {
		t.Fatalf("calibrated model invalid: %v", err)
	}
	for _, o := range obs {
		if p := cal.Predict(o.Features, cfg.Placement); math.IsNaN(p) || math.IsInf(p, 0) || p < 0 {
			t.Fatalf("prediction %v for %+v", p, o)
		}
	}
}

// FuzzCalibrate feeds arbitrary numbers (any float64 bit pattern) as
// observations mixed into real ones: Calibrate never returns a model that
// would fail to plan.
func FuzzCalibrate(f *testing.F) {
	seed := make([]byte, 0, 64)
	for _, v := range []float64{1e308, 1, 1, 1, 1, 1, 1, 1e308} {
		seed = binary.LittleEndian.AppendUint64(seed, math.Float64bits(v))
	}
	f.Add(seed, uint8(16))
	f.Add([]byte{}, uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, copies uint8) {
		m, _ := NewCostModel(TinyShape())
		obs := observations(int(NumFeatures)+4, m, Modality, 0, 0.01, 7)
		for len(b) >= 8*(int(NumFeatures)+1) {
			var o Observation
			for i := range o.Features {
				o.Features[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
			}
			o.Seconds = math.Float64frombits(binary.LittleEndian.Uint64(b[8*int(NumFeatures):]))
			b = b[8*(int(NumFeatures)+1):]
			if o.Validate() != nil {
				continue // the serve path refuses these before they are observations
			}
			for range copies % 32 {
				obs = append(obs, o)
			}
		}
		checkCalibration(t, m, obs, CalibrateConfig{Placement: Modality, FitOverhead: copies%2 == 1})
	})
}
