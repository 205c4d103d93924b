package main

import (
	"flag"
	"strings"
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

func TestDatasetFlags(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	j := bindJobFlags(fs)
	err := fs.Parse([]string{"--input", "m.jsonl", "--root", "/data", "--allow-absolute-paths",
		"--image-field", "image.bytes", "--text-field", "caption", "--id-field", "url"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := j.config()
	if err != nil {
		t.Fatal(err)
	}
	got := c.Loader
	if got.Root != "/data" || !got.AllowAbsolute || got.ImageColumn != "image.bytes" || got.TextColumn != "caption" || got.IDColumn != "url" {
		t.Errorf("loader options %+v, want root /data, absolute allowed, image.bytes/caption/url", got)
	}
}

// --input file:///x is the path /x for every command that takes an input
// (serve and report failed on "stat file:///x"; shard staged it).
func TestInputFileURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"file:///data/m.jsonl", "/data/m.jsonl"},
		{"m.jsonl", "m.jsonl"},
		{"s3://bucket/m.jsonl", "s3://bucket/m.jsonl"},
	} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		j := bindJobFlags(fs)
		if err := fs.Parse([]string{"--input", tc.in}); err != nil {
			t.Fatal(err)
		}
		c, err := j.config()
		if err != nil {
			t.Fatal(err)
		}
		if c.Input != tc.want {
			t.Errorf("--input %s: %q, want %q", tc.in, c.Input, tc.want)
		}
	}
}

func TestModelFlags(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		patch     int
		wantError string
	}{
		{[]string{"--model", "base-8h"}, 16, ""},
		{[]string{"--model", "base", "--patch-size", "14"}, 14, ""},
		{[]string{"--model", "../../balancer/presets/tiny.json", "--patch-size", "32"}, 32, ""},
		{[]string{"--model", "nope.json"}, 0, "no such file"},
		{[]string{"--patch-size", "-1"}, 0, "--patch-size -1"},
	} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		j := bindJobFlags(fs)
		if err := fs.Parse(append([]string{"--input", "m.jsonl"}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		c, err := j.config()
		if tc.wantError != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantError) {
				t.Errorf("%v: got %v, want an error containing %q", tc.args, err, tc.wantError)
			}
			continue
		}
		if err != nil || c.Image.PatchSize != tc.patch {
			t.Errorf("%v: patch size %d (%v), want %d", tc.args, c.Image.PatchSize, err, tc.patch)
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
		{[]string{"--decode", "reduce", "--dtype", "jpeg"}, imgproc.DecodeReduce, false},
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
