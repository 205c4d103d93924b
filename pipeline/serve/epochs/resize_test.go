package epochs

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
)

// TestResizeReplays: an epoch planned at dp 2 and resized to dp 1 (or 4) from
// step 2 replays to the same steps (a restarted service serves what the
// trainers were served), keeps the steps before the resize, and holds the
// base plan's real samples once each.
func TestResizeReplays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	input := corpus(t, 96)
	old := testConfig(t, input, 2)
	base, err := PrepareWhole(ctx, old, 0, nil, old.Pipeline.Plan.Model)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	if base.info.DP != 2 {
		t.Fatalf("epoch info dp %d, want 2", base.info.DP)
	}
	for _, dp := range []int{1, 4} {
		cfg := testConfig(t, input, dp)
		cfg.Pipeline.Plan.GlobalBatch = old.Pipeline.Plan.GlobalBatch // a resize keeps the global batch
		stored := base.info
		stored.Resize = &ResizeSegment{FromStep: 2, DP: dp, Segments: 1}
		var got [][]int32
		for range 2 {
			ep, err := PrepareWhole(ctx, cfg, 0, &stored, cfg.Pipeline.Plan.Model)
			if err != nil {
				t.Fatalf("dp %d: %v", dp, err)
			}
			if ep.info.PlanHash != base.info.PlanHash || ep.info.DP != 2 || ep.info.Resize == nil {
				t.Errorf("dp %d: info %+v: want the base plan's hash and dp 2 with the resize recorded", dp, ep.info)
			}
			for k, s := range ep.steps {
				want := dp
				if k < 2 {
					want = 2
					if !slices.EqualFunc(s.Ranks, base.steps[k].Ranks, func(a, b []balancer.MicroBatch) bool { return slices.EqualFunc(a, b, slices.Equal) }) {
						t.Errorf("dp %d: step %d before the resize changed", dp, k)
					}
				}
				if s.Index != k || len(s.Ranks) != want {
					t.Fatalf("dp %d: step %d: index %d, %d ranks, want %d ranks", dp, k, s.Index, len(s.Ranks), want)
				}
			}
			if ep.PlanFrom(2).Config.DP != dp {
				t.Errorf("dp %d: planFrom(2) has dp %d", dp, ep.PlanFrom(2).Config.DP)
			}
			got = append(got, liveItems(ep.steps))
			ep.Close()
		}
		if !slices.Equal(got[0], got[1]) {
			t.Errorf("dp %d: the resize does not replay identically", dp)
		}
		if want := liveItems(base.steps); !slices.Equal(sorted(got[0]), sorted(want)) {
			t.Errorf("dp %d: %d real samples after the resize, the base plan has %d", dp, len(got[0]), len(want))
		}
	}
	bad := base.info
	bad.Resize = &ResizeSegment{FromStep: base.info.Steps + 1, DP: 1, Segments: 1}
	if err := bad.Validate(); !errors.Is(err, ErrState) {
		t.Errorf("resize past the epoch's end validates: %v", err)
	}
}

func liveItems(steps []balancer.Step) []int32 {
	var out []int32
	for _, s := range steps {
		for _, rank := range s.Ranks {
			for _, mb := range rank {
				for _, e := range mb {
					if e.Weight > 0 {
						out = append(out, e.Item)
					}
				}
			}
		}
	}
	return out
}

func sorted(x []int32) []int32 {
	y := slices.Clone(x)
	slices.Sort(y)
	return y
}
