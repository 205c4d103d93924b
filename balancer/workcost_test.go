package balancer

import (
	"math"
	"math/rand/v2"
	"testing"
)

// randomItem is a micro-batch of 8 images of random size and format.
func randomItem(r *rand.Rand, pngShare float64) WorkCost {
	var x WorkCost
	for range 8 {
		w, h := 200+r.IntN(1800), 200+r.IntN(1200)
		mp := float64(w*h) / 1e6
		if r.Float64() < pngShare {
			x[WorkOtherMP] += mp
			x[WorkMB] += mp * (0.5 + 2*r.Float64()) // bytes per pixel vary with content
		} else {
			x[WorkJPEGMP] += mp
			x[WorkMB] += mp * (0.05 + 0.5*r.Float64())
		}
		x[WorkSamples]++
	}
	return x
}

// The fitted model learns what each dimension costs, beats the prior's
// shape scaled by one measured rate (the model before formats), and never
// predicts a negative cost.
func TestWorkCostModelLearnsFormats(t *testing.T) {
	for _, tc := range []struct {
		name  string
		truth WorkCost
	}{
		{"png slower", WorkCost{0.010, 0.040, 0.002, 0.001}},
		{"jpeg slower", WorkCost{0.030, 0.008, 0.000, 0.002}},
		{"bytes cost", WorkCost{0.015, 0.020, 0.010, 0.003}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			var m WorkCostModel
			rate := 0.0 // the single measured seconds per unit (EWMA) it replaces
			var errModel, errRate float64
			for i := range 400 {
				x := randomItem(r, 0.3)
				secs := x.Dot(tc.truth) * (0.9 + 0.2*r.Float64())
				if i >= 200 { // score the second half, predicted before fitting
					errModel += math.Abs(m.Predict(x) - secs)
					errRate += math.Abs(rate*x.Units() - secs)
				}
				m.Observe(x, secs)
				if rate == 0 {
					rate = secs / x.Units()
				} else {
					rate = 0.9*rate + 0.1*secs/x.Units()
				}
			}
			t.Logf("coefficients %v, truth %v; mean abs error %.4f s (fit), %.4f s (one rate)", m.coef, tc.truth, errModel/200, errRate/200)
			if errModel >= errRate {
				t.Errorf("the fit's error %.4f is not below one rate's %.4f", errModel/200, errRate/200)
			}
			for i, c := range m.coef {
				if c < 0 {
					t.Errorf("coefficient %d is %v", i, c)
				}
			}
			if (m.coef[WorkJPEGMP] > m.coef[WorkOtherMP]) != (tc.truth[WorkJPEGMP] > tc.truth[WorkOtherMP]) {
				t.Errorf("JPEG %.4f and other %.4f s/MP: the order differs from the truth's", m.coef[WorkJPEGMP], m.coef[WorkOtherMP])
			}
		})
	}
}

// Before any measurement there is no prediction; after one, the prior's
// shape scaled to it predicts that item exactly.
func TestWorkCostModelFirstItem(t *testing.T) {
	var m WorkCostModel
	x := WorkCost{1, 0.5, 0.4, 8}
	if m.Fitted() || m.Predict(x) != 0 {
		t.Fatal("predicts before any measurement")
	}
	m.Observe(x, 0.19)
	if got := m.Predict(x); math.Abs(got-0.19) > 0.01 {
		t.Errorf("after one item predicts %.4f s for it, measured 0.19", got)
	}
	y := WorkCost{2, 1, 0.8, 16}
	if got := m.Predict(y); math.Abs(got-0.38) > 0.02 {
		t.Errorf("an item of twice the cost: %.4f s, want about 0.38", got)
	}
}
