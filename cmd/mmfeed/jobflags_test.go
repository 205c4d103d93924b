package main

import (
	"flag"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
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

// TestDecodeFlag: --decode reaches the image config, exact by default, and a bad value is
// refused by the config's validation.
func TestDecodeFlag(t *testing.T) {
	tests := []struct {
		args    []string
		want    string
		wantErr bool
	}{
		{nil, imgproc.DecodeExact, false},
		{[]string{"--decode", "fast"}, imgproc.DecodeFast, false},
		{[]string{"--decode", "exact"}, imgproc.DecodeExact, false},
		{[]string{"--decode", "draft"}, "", true},
	}
	for _, tt := range tests {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		j := bindJobFlags(fs)
		if err := fs.Parse(append([]string{"--input", "x.jsonl"}, tt.args...)); err != nil {
			t.Fatal(err)
		}
		c, err := j.config()
		if (err != nil) != tt.wantErr {
			t.Fatalf("%v: err %v, want error %t", tt.args, err, tt.wantErr)
		}
		if err == nil && c.Image.Decode != tt.want {
			t.Errorf("%v: Decode %q, want %q", tt.args, c.Image.Decode, tt.want)
		}
	}
}
