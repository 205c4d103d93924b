package pipeline

import (
	"bytes"
	"context"
	"reflect"
	"testing"

	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/tokenize"
)

// Features computed by ranges (as feature work items do) and assembled by
// Prepare equal the feature pass's, rejects included, for every range size.
func TestFeaturesByRangesEqualTheFeaturePass(t *testing.T) {
	input := corpus(t, 150, "jsonl")
	cfg := testConfig(input)
	var wantQ bytes.Buffer
	want, err := Prepare(context.Background(), cfg, &wantQ)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	if want.Quarantine.Total() == 0 {
		t.Fatal("the corpus quarantined nothing: the test would not check rejects")
	}
	for _, size := range []int{1, 7, 64, 1000} {
		c := cfg
		calls := 0
		c.Features = func(ctx context.Context, ix *loader.Index) ([]EntryFeatures, error) {
			tk, err := tokenize.Open(cfg.Tokenizer)
			if err != nil {
				return nil, err
			}
			defer tk.Close()
			var all []EntryFeatures
			for lo := 0; lo < ix.Len(); lo += size {
				calls++
				part, err := FeaturesRange(ctx, ix, lo, min(lo+size, ix.Len()), tk, cfg.Image)
				if err != nil {
					return nil, err
				}
				all = append(all, part...)
			}
			return all, nil
		}
		var q bytes.Buffer
		got, err := Prepare(context.Background(), c, &q)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.Features, want.Features) {
			t.Errorf("range %d: features differ from the feature pass", size)
		}
		if got.Quarantine.Total() != want.Quarantine.Total() {
			t.Errorf("range %d: %d quarantined, the feature pass %d", size, got.Quarantine.Total(), want.Quarantine.Total())
		}
		if calls == 0 {
			t.Errorf("range %d: Features was never called", size)
		}
		got.Close()
	}
	ix := want.Index
	for _, r := range [][2]int{{-1, 2}, {3, 2}, {0, ix.Len() + 1}} {
		if _, err := FeaturesRange(context.Background(), ix, r[0], r[1], want.Tokenizer, cfg.Image); err == nil {
			t.Errorf("range %v: no error", r)
		}
	}
}
