package main

import (
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
)

func TestScaleModel(t *testing.T) {
	base, err := balancer.NewCostModel(balancer.TinyShape())
	if err != nil {
		t.Fatal(err)
	}
	got, err := scaleModel(base, "1, 8,0.5")
	if err != nil {
		t.Fatal(err)
	}
	f := balancer.FeaturesOf(40, 196, 0.5)
	for c, want := range []float64{1, 8, 0.5} {
		if g, b := got.Coef[c].Dot(f), base.Coef[c].Dot(f); g != want*b {
			t.Errorf("component %d: cost %v, want %v × %v", c, g, want, b)
		}
	}
	for _, bad := range []string{"1,2", "1,0,1", "a,1,1", "1,-1,1", "1,Inf,1"} {
		if _, err := scaleModel(base, bad); err == nil {
			t.Errorf("scaleModel(%q) accepted", bad)
		}
	}
}
