package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"testing"
)

// Features.ID and Features.ImageSize, which the planner reads per sample
// without re-reading a manifest line, equal the materialised entry's, for
// a plain (packed) index and for a mixture with repeated draws.
func TestFeaturesIDAndSizeEqualTheEntry(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"jsonl", testConfig(corpus(t, 60, "jsonl"))},
		{"wds", testConfig(corpus(t, 60, "wds"))},
		{"mixture", mixConfig(t, 60, 20, 10, 0, "")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var q bytes.Buffer
			prep, err := Prepare(context.Background(), tt.cfg, &q)
			if err != nil {
				t.Fatal(err)
			}
			defer prep.Close()
			f := &prep.Features
			if f.Len() == 0 {
				t.Fatal("no features")
			}
			for i := range f.Len() {
				e := f.Entry(i)
				if got := f.ID(i); got != e.ID || got != f.Items[i].ID {
					t.Fatalf("item %d: ID %q, entry %q, item %q", i, got, e.ID, f.Items[i].ID)
				}
				if got := f.ImageSize(i); got != e.ImageSize || got <= 0 {
					t.Fatalf("item %d: ImageSize %d, entry %d", i, got, e.ImageSize)
				}
			}
		})
	}
}

// The format column keeps every format, one byte each up to 256 distinct
// ones and as strings past them (formats from a cache or a worker are
// outside input).
func TestFormatColumnKeepsEveryFormat(t *testing.T) {
	for _, distinct := range []int{1, 3, 256, 257, 1000} {
		t.Run(fmt.Sprint("distinct=", distinct), func(t *testing.T) {
			var want []string
			for i := range 30000 {
				want = append(want, fmt.Sprint("f", (i*7)%distinct))
			}
			f := NewFeatures(nil, nil, nil, want)
			for i, w := range want {
				if got := f.Format(i); got != w {
					t.Fatalf("format %d: %q, want %q", i, got, w)
				}
			}
			if got := f.Format(len(want)); got != "" {
				t.Errorf("format past the end: %q, want \"\"", got)
			}
			if per := float64(f.FormatBytes()) / float64(len(want)); distinct <= 256 && per > 1.5 {
				t.Errorf("%.1f bytes per format with %d distinct, want about 1", per, distinct)
			}
		})
	}
}
