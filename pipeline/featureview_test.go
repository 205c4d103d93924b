package pipeline

import (
	"bytes"
	"context"
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
