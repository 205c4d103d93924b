package pipeline

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/internal/hostile"
	"github.com/mmfeed/mmfeed/loader"
)

// TestShardHostileInputs feeds every hostile input kind through `shard`
// (Prepare, Plan, WriteShards) for each source format and checks that each
// is quarantined with its reason (or delivered, when it is valid input),
// that the run completes within a bound, and that every sample is
// accounted for: planned with weight 1, quarantined, or dropped at the tail.
func TestShardHostileInputs(t *testing.T) {
	for _, format := range []string{"jsonl", "folder", "wds", "parquet"} {
		t.Run(format, func(t *testing.T) {
			input, want := hostile.Dataset(t, format)
			out := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var q bytes.Buffer
			cfg := testConfig(input)
			cfg.Plan.DP, cfg.Plan.MicroBatches, cfg.Plan.GlobalBatch = 2, 1, 4
			cfg.Loader.MaxCaptionBytes = 1 << 20
			cfg.Image.MaxImagePixels = 4 << 20
			prep, err := Prepare(ctx, cfg, &q)
			if err != nil {
				t.Fatal(err)
			}
			defer prep.Close()
			plan, err := prep.Plan(balancer.StrategyMmfeed)
			if err != nil {
				t.Fatal(err)
			}
			sum, err := WriteShards(ctx, prep, plan, out, nil)
			if err != nil {
				t.Fatalf("shard did not complete: %v", err)
			}
			rejects, err := loader.ReadQuarantine(&q)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, r := range rejects {
				for _, h := range want {
					if h.Loc != "" && strings.HasSuffix(r.Location, h.Loc) {
						r.ID = h.ID
					}
				}
				if r.Reason == "" || r.Detail == "" && r.Reason != loader.ReasonBinaryCaption && r.Reason != loader.ReasonEmptyCaption {
					t.Errorf("reject %+v lacks a reason or detail", r)
				}
				got[r.ID] = r.Reason
			}
			real := map[string]int{}
			for _, f := range sum.Files {
				readShard(t, f, func(id string, w float32) {
					if w > 0 {
						real[id]++
					}
				})
			}
			dropped := map[string]bool{}
			for _, d := range plan.Dropped {
				dropped[prep.Features.Items[d].ID] = true
			}
			for _, h := range want {
				switch {
				case h.Reason != "" && got[h.ID] != h.Reason:
					t.Errorf("%s: quarantined as %q, want %q", h.ID, got[h.ID], h.Reason)
				case h.Reason == "" && real[h.ID] != 1 && !dropped[h.ID]:
					t.Errorf("%s: delivered %d times (quarantined as %q), want once", h.ID, real[h.ID], got[h.ID])
				}
			}
			for id, n := range real {
				if n != 1 {
					t.Errorf("%s delivered %d times", id, n)
				}
			}
			if total := len(real) + len(rejects) + len(plan.Dropped); total != int(prep.Seen()) {
				t.Errorf("planned %d + quarantined %d + dropped %d = %d, want seen %d",
					len(real), len(rejects), len(plan.Dropped), total, prep.Seen())
			}
		})
	}
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
