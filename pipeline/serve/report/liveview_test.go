package report

import (
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
)

// TestFitHistory: the page's calibration history refits growing prefixes of
// the observations and ends with the report's own calibration.
func TestFitHistory(t *testing.T) {
	prior, _ := balancer.NewCostModel(balancer.TinyShape()) // the service's prior without a model
	src := &fixedObservations{prior: prior, minObs: 8}
	for i := range 40 {
		f := balancer.FeaturesOf(10+i%7*20, 196, 0)
		src.obs = append(src.obs, balancer.Observation{Features: f, Seconds: 1e-3*f[balancer.FeatL] + 2e-4*f[balancer.FeatP] + float64(i%3)*1e-3})
	}
	p := NewViews(src)
	if h := p.fitHistory(nil); len(h) != 4 || h[0].Observations != 8 || h[3].Observations != 32 {
		t.Fatalf("history %+v, want fits at 8, 16, 24, 32 observations", h)
	}
	cur, err := balancer.Calibrate(src.prior, src.obs, src.cfg) // as the calibrator's snapshot fits every observation
	if err != nil {
		t.Fatal(err)
	}
	h := p.fitHistory(&cur)
	if len(h) != 5 || h[4].Observations != 40 || h[4].R2 != cur.Fit.R2 {
		t.Errorf("history %+v does not end with the report's fit %+v", h, cur.Fit)
	}
	for _, pt := range h {
		if pt.R2 > 1 || pt.RelErr < 0 || pt.PriorRelErr <= 0 {
			t.Errorf("implausible fit %+v", pt)
		}
	}
}

// fixedObservations is an ObservationSource of a fixed list.
type fixedObservations struct {
	obs    []balancer.Observation
	prior  balancer.CostModel
	cfg    balancer.CalibrateConfig
	minObs int
}

func (f *fixedObservations) Observations() ([]balancer.Observation, balancer.CostModel, balancer.CalibrateConfig, int) {
	return append([]balancer.Observation(nil), f.obs...), f.prior, f.cfg, f.minObs
}
