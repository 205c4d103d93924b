package balancer

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestNNLS(t *testing.T) {
	tests := []struct {
		name string
		rows [][]float64
		y    []float64
		want []float64
	}{
		{"exact", [][]float64{{1, 0}, {0, 1}, {1, 1}}, []float64{2, 3, 5}, []float64{2, 3}},
		{"clamped", [][]float64{{1, 0}, {0, 1}, {1, 1}}, []float64{2, -3, -1}, []float64{0.5, 0}},
		{"zero column", [][]float64{{1, 0}, {2, 0}}, []float64{1, 2}, []float64{1, 0}},
		{"scaled", [][]float64{{1e6, 1}, {2e6, 1}, {3e6, 1}}, []float64{3, 5, 7}, []float64{2e-6, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := nnlsScaled(tt.rows, tt.y)
			for j := range tt.want {
				if math.Abs(got[j]-tt.want[j]) > 1e-6*math.Max(1, math.Abs(tt.want[j])) {
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			}
		})
	}
}

// observations draws rank-steps of 8 to 24 items, timed by truth plus overhead and
// relative Gaussian noise.
func observations(n int, truth CostModel, pl Placement, overhead, noise float64, seed uint64) []Observation {
	rng := rand.New(rand.NewPCG(seed, 1))
	items := genItems(24*n, genDynamic, seed)
	obs := make([]Observation, n)
	for i := range obs {
		var f Features
		for _, it := range items[i*24 : i*24+8+rng.IntN(17)] {
			f = f.Add(FeaturesOf(it.TextTokens, it.ImageTokens, it.Complexity))
		}
		t := pl.StepCost(truth.CostOf(f)) + overhead
		obs[i] = Observation{Features: f, Seconds: t * (1 + noise*rng.NormFloat64())}
	}
	return obs
}

func TestCalibrateRecovers(t *testing.T) {
	base, _ := NewCostModel(BaseShape())
	// Truth: the base model at 40% MFU of a 400 TFLOP/s device, text twice as
	// slow as FLOPs say and a per-sample overhead. The observations carry
	// image complexity, which the GPU time does not depend on.
	truth := base
	const secPerGFLOP = 1 / (0.4 * 400e3)
	for c := range NumComponents {
		truth.Coef[c] = truth.Coef[c].Scale(secPerGFLOP)
	}
	truth.Coef[Text] = truth.Coef[Text].Scale(2)
	truth.Coef[Fusion][FeatOne] = 1e-4
	// A deliberately wrong prior: vision ×5, no fusion, no text quadratic.
	wrong := base
	wrong.Coef[Vision] = wrong.Coef[Vision].Scale(5)
	wrong.Coef[Fusion] = Features{}
	wrong.Coef[Text][FeatL2] = 0
	for _, pl := range []Placement{Colocated, Modality} {
		for _, overhead := range []float64{0, 0.05} {
			t.Run(fmt.Sprintf("%v/overhead=%v", pl, overhead), func(t *testing.T) {
				obs := observations(400, truth, pl, overhead, 0.01, 5)
				cal, err := Calibrate(wrong, obs, CalibrateConfig{Placement: pl, FitOverhead: overhead > 0})
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("fit %+v, prior %+v, overhead %.4g", cal.Fit, cal.Prior, cal.Overhead)
				// 1% Gaussian noise: mean relative error ≈ 0.8% at best.
				if cal.Fit.R2 < 0.99 || cal.Fit.MeanRelErr > 0.01 {
					t.Errorf("fit %+v, want R² ≥ 0.99 and error ≤ 1%%", cal.Fit)
				}
				if cal.Fit.MeanRelErr >= cal.Prior.MeanRelErr || cal.Fit.R2 <= cal.Prior.R2 {
					t.Errorf("calibrated %+v not better than prior %+v", cal.Fit, cal.Prior)
				}
				// Held-out rank-steps, noise-free.
				for _, o := range observations(50, truth, pl, overhead, 0, 99) {
					if got := cal.Predict(o.Features, pl); math.Abs(got-o.Seconds) > 0.02*o.Seconds {
						t.Fatalf("held-out: predicted %v s, measured %v s", got, o.Seconds)
					}
				}
				if overhead > 0 && math.Abs(cal.Overhead-overhead) > 0.2*overhead {
					t.Errorf("overhead %v, want %v", cal.Overhead, overhead)
				}
				if err := cal.Model.Validate(); err != nil {
					t.Errorf("negative or invalid coefficient: %v", err)
				}
			})
		}
	}
}

func TestCalibrateErrors(t *testing.T) {
	m, _ := NewCostModel(TinyShape())
	if _, err := Calibrate(m, nil, CalibrateConfig{}); !errors.Is(err, ErrNoObservations) {
		t.Errorf("got %v, want ErrNoObservations", err)
	}
	obs := observations(10, m, Colocated, 0, 0, 1)
	obs[3].Seconds = math.NaN()
	if _, err := Calibrate(m, obs, CalibrateConfig{}); !errors.Is(err, ErrMalformed) {
		t.Errorf("got %v, want ErrMalformed", err)
	}
}

func TestReadObservations(t *testing.T) {
	tests := []struct {
		name string
		in   string
		n    int
		ok   bool
	}{
		{"two", `{"features":[1,1,196,38416,196,0.5,1],"seconds":0.1}` + "\n\n" + `{"features":[2,4,0,0,0,0,1],"seconds":2e-3}`, 2, true},
		{"empty", "", 0, true},
		{"not json", "{", 0, false},
		{"negative", `{"features":[-1,0,0,0,0,0,1],"seconds":1}`, 0, false},
		{"zero time", `{"features":[1,1,1,1,1,1,1],"seconds":0}`, 0, false},
		{"too many", `{"features":[1,1,1,1,1,1,1,1],"seconds":1}`, 0, false},
		{"long line", `{"features":[` + strings.Repeat(" ", MaxObservationLine) + `]}`, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obs, err := ReadObservations(strings.NewReader(tt.in))
			if tt.ok != (err == nil) || len(obs) != tt.n {
				t.Fatalf("got %d, %v; want %d (ok=%v)", len(obs), err, tt.n, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrMalformed) {
				t.Errorf("error %v is not ErrMalformed", err)
			}
		})
	}
}

func FuzzReadObservations(f *testing.F) {
	f.Add([]byte(`{"features":[1,1,196,38416,196,0.5,1],"seconds":0.1}`))
	f.Add([]byte("{\"features\":[1e308,1,1,1,1,1,1],\"seconds\":1e-300}\n\n{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		obs, err := ReadObservations(bytes.NewReader(b))
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		for _, o := range obs {
			if err := o.Validate(); err != nil {
				t.Fatalf("accepted invalid observation: %v", err)
			}
		}
		if len(obs) > int(NumFeatures) {
			m, _ := NewCostModel(TinyShape())
			checkCalibration(t, m, obs, CalibrateConfig{FitOverhead: true})
		}
	})
}

// TestCalibrateModalitySplit: when each tower is the larger on part of the
// rank-steps, noise-free observations identify every coefficient, and the
// modality fit recovers the truth's vision / text / fusion split from a prior
// that has no fusion at all and the wrong scales (the restricted fit alone,
// or one alternation from the prior's choice, stops in a local optimum
// there).
func TestCalibrateModalitySplit(t *testing.T) {
	base, _ := NewCostModel(BaseShape())
	wrong := base
	wrong.Coef[Vision] = wrong.Coef[Vision].Scale(5)
	wrong.Coef[Fusion] = Features{}
	wrong.Coef[Text][FeatL2] = 0
	for _, textScale := range []float64{10, 20} { // vision the larger on 95% and 10% of the rank-steps
		t.Run(fmt.Sprintf("text×%v", textScale), func(t *testing.T) {
			truth := base
			for c := range NumComponents {
				truth.Coef[c] = truth.Coef[c].Scale(1 / (0.4 * 400e3))
			}
			truth.Coef[Text] = truth.Coef[Text].Scale(textScale)
			truth.Coef[Fusion][FeatOne] = 1e-4
			cal, err := Calibrate(wrong, observations(400, truth, Modality, 0, 0, 5), CalibrateConfig{Placement: Modality})
			if err != nil {
				t.Fatal(err)
			}
			if cal.Fit.MeanRelErr > 1e-6 {
				t.Errorf("noise-free fit error %v, want ≈ 0", cal.Fit.MeanRelErr)
			}
			for f := range NumFeatures {
				var scale float64
				for c := range NumComponents {
					scale = max(scale, truth.Coef[c][f])
				}
				for c := range NumComponents {
					if got, want := cal.Model.Coef[c][f], truth.Coef[c][f]; math.Abs(got-want) > 1e-4*scale {
						t.Errorf("%v %v: got %.6g, want %.6g", Component(c), Feature(f), got, want)
					}
				}
			}
		})
	}
}
