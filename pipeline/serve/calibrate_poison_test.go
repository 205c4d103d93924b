package serve

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/proto"
)

// poisonSetup is a calibrator for dp=2, mp=2 and the true model behind the
// honest feedback.
func poisonSetup() (*calibrator, balancer.CostModel, func(step, dp int) balancer.Features) {
	cfg := DefaultConfig()
	cfg.MP, cfg.MinObservations = 2, 8
	cfg.Pipeline.Plan.DP = 2
	truth, _ := balancer.NewCostModel(balancer.TinyShape())
	for c := range balancer.NumComponents {
		truth.Coef[c] = truth.Coef[c].Scale(1e-3)
	}
	cfg.Pipeline.Plan.Model = truth
	feats := func(step, dp int) balancer.Features {
		var f balancer.Features
		for i := range 4 + (step+dp)%5 {
			f = f.Add(balancer.FeaturesOf(10+7*((step*3+i+dp)%13), 16*(1+(step+i)%4), 0.5))
		}
		return f
	}
	return newCalibrator(cfg), truth, feats
}

// TestCalibratorRefusesPoison: the feedback that broke planning (sixteen
// compute_seconds = 1e308) is refused, a repeated (step, dp, mp) counts
// once, one rank flooding feedback keeps only its share, and the fit stays
// close to the truth.
func TestCalibratorRefusesPoison(t *testing.T) {
	c, truth, feats := poisonSetup()
	honest := func(step, dp, mp int) proto.Feedback {
		return proto.Feedback{Job: "j", Step: step, DPRank: dp, MPRank: mp,
			ComputeSeconds: balancer.Colocated.StepCost(truth.CostOf(feats(step, dp)))}
	}
	for step := range 40 {
		for dp := range 2 {
			for mp := range 2 {
				if !c.add(honest(step, dp, mp), feats(step, dp)) {
					t.Fatalf("honest feedback step %d dp %d mp %d refused", step, dp, mp)
				}
			}
		}
	}
	for step := range 16 {
		fb := honest(step, 0, 0)
		fb.ComputeSeconds = 1e308
		if c.add(fb, feats(step, 0)) {
			t.Errorf("1e308 seconds accepted")
		}
		fb.ComputeSeconds = 5 // plausible, but a repeat of (step, dp 0, mp 0)
		if c.add(fb, feats(step, 0)) {
			t.Errorf("repeated feedback for step %d accepted", step)
		}
	}
	for step := 40; step < 40+maxObservations; step++ { // dp 1 floods slow steps
		for mp := range 2 {
			fb := honest(step, 1, mp)
			fb.ComputeSeconds *= 50
			c.add(fb, feats(step, 1))
		}
	}
	if n := len(c.byRank[0]); n != 40 {
		t.Errorf("dp 0 keeps %d observations, want its 40", n)
	}
	if n := len(c.byRank[1]); n != maxObservations/2 {
		t.Errorf("dp 1 keeps %d observations, want its share %d", n, maxObservations/2)
	}
	if n := len(c.obs); n != 40+80 {
		t.Errorf("the fit uses %d observations, want 40 of dp 0 and at most twice that (80) of dp 1", n)
	}
	cal, ok := c.fit()
	if !ok {
		t.Fatal("no fit")
	}
	if err := cal.Model.Validate(); err != nil {
		t.Fatalf("model: %v", err)
	}
	got := cal.Predict(feats(3, 0), balancer.Colocated)
	if want := balancer.Colocated.StepCost(truth.CostOf(feats(3, 0))); !(got >= want/2 && got <= 50*want) {
		t.Errorf("predicted %v s, want between the truth %v and the flood's 50×", got, want)
	}
}

// FuzzFeedback drives the feedback path end to end from the wire bytes:
// decode (as handleFeedback does), add, refit. Whatever arrives, the model
// the planner gets validates and predicts finite times.
func FuzzFeedback(f *testing.F) {
	for _, fb := range []proto.Feedback{
		{Job: "j", Step: 1, DPRank: 0, MPRank: 0, ComputeSeconds: 1e308},
		{Job: "j", Step: 2, DPRank: 1, MPRank: 1, ComputeSeconds: 0.01},
		{Job: "j", Step: -5, DPRank: 1, MPRank: 3, ComputeSeconds: -1},
	} {
		b, _ := json.Marshal(fb)
		f.Add(b, uint8(16))
	}
	f.Fuzz(func(t *testing.T, data []byte, repeat uint8) {
		c, truth, feats := poisonSetup()
		for step := range 12 {
			for dp := range 2 {
				for mp := range 2 {
					s := balancer.Colocated.StepCost(truth.CostOf(feats(step, dp)))
					c.add(proto.Feedback{Step: step, DPRank: dp, MPRank: mp, ComputeSeconds: s}, feats(step, dp))
				}
			}
		}
		var fb proto.Feedback
		if proto.DecodeControl(data, &fb) != nil {
			return
		}
		for i := range int(repeat) {
			fb.Step += i % 3
			c.add(fb, feats(fb.Step, fb.DPRank))
		}
		m, ok := c.model()
		if !ok {
			t.Fatal("no model after 12 honest steps")
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("model: %v", err)
		}
		if p := balancer.Colocated.StepCost(m.CostOf(feats(1, 0))); math.IsNaN(p) || math.IsInf(p, 0) {
			t.Fatalf("prediction %v", p)
		}
	})
}
