package serve

import (
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
)

// TestFitHistory: the page's calibration history refits growing prefixes of
// the observations and ends with the report's own calibration.
func TestFitHistory(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MinObservations = 8
	s := &Service{cal: newCalibrator(cfg)}
	for i := range 40 {
		f := balancer.FeaturesOf(10+i%7*20, 196, 0)
		s.cal.obs = append(s.cal.obs, balancer.Observation{Features: f, Seconds: 1e-3*f[balancer.FeatL] + 2e-4*f[balancer.FeatP] + float64(i%3)*1e-3})
	}
	s.cal.added = len(s.cal.obs) // as add counts them
	p := newLiveViews(s.cal)
	if h := p.fitHistory(nil); len(h) != 4 || h[0].Observations != 8 || h[3].Observations != 32 {
		t.Fatalf("history %+v, want fits at 8, 16, 24, 32 observations", h)
	}
	cur, _ := s.cal.snapshot()
	h := p.fitHistory(cur)
	if len(h) != 5 || h[4].Observations != 40 || h[4].R2 != cur.Fit.R2 {
		t.Errorf("history %+v does not end with the report's fit %+v", h, cur.Fit)
	}
	for _, pt := range h {
		if pt.R2 > 1 || pt.RelErr < 0 || pt.PriorRelErr <= 0 {
			t.Errorf("implausible fit %+v", pt)
		}
	}
}
