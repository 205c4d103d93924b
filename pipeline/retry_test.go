package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
)

// TestTransientReadRetried: an image read that fails twice with EIO and then
// works is delivered (weight 1), not zeroed; one that keeps failing is
// quarantined once, with the attempts in its detail, and the run completes.
func TestTransientReadRetried(t *testing.T) {
	var q bytes.Buffer
	prep, err := Prepare(context.Background(), testConfig(corpus(t, 80, "jsonl")), &q)
	mustOK(t, err)
	defer prep.Close()
	plan, err := prep.Plan(balancer.StrategyMmfeed)
	mustOK(t, err)
	before := prep.Quarantine.Total()
	pp, err := NewPreprocessor(prep)
	mustOK(t, err)
	broken := prep.Features.Items[plan.Steps[0].Ranks[0][0][0].Item].ID
	var mu sync.Mutex
	calls := map[string]int{}
	pp.read = func(ctx context.Context, e loader.Entry) ([]byte, error) {
		mu.Lock()
		calls[e.ID]++
		n := calls[e.ID]
		mu.Unlock()
		if e.ID == broken || n <= 2 {
			return nil, fmt.Errorf("read %s: %w", e.Location, syscall.EIO)
		}
		return prep.Index.ReadImageContext(ctx, e)
	}
	zero := map[string]bool{}
	mustOK(t, pp.Run(context.Background(), plan, func(sb StepBatch) error {
		for _, mbs := range sb.Rows {
			for _, rows := range mbs {
				for _, r := range rows {
					if r.Weight == 0 {
						zero[r.ID] = true
					}
				}
			}
		}
		return nil
	}))
	padding := map[string]bool{}
	for _, s := range plan.Steps {
		for _, mbs := range s.Ranks {
			for _, mb := range mbs {
				for _, e := range mb {
					if e.Weight == 0 {
						padding[prep.Features.Items[e.Item].ID] = true
					}
				}
			}
		}
	}
	for id := range zero {
		if id != broken && !padding[id] {
			t.Errorf("%s zeroed after transient read errors", id)
		}
	}
	if !zero[broken] {
		t.Errorf("the always-failing sample %s was not zeroed", broken)
	}
	if got := prep.Quarantine.Total() - before; got != 1 {
		t.Errorf("quarantined %d samples while preprocessing, want 1", got)
	}
	rj, err := loader.ReadQuarantine(&q)
	mustOK(t, err)
	last := rj[len(rj)-1]
	if last.ID != broken || last.Reason != ReasonReadFailed || !strings.Contains(last.Detail, "after 3 attempts") {
		t.Errorf("last reject %+v, want %s unreadable_image after 3 attempts", last, broken)
	}
	if n := calls[broken]; n < readAttempts || n%readAttempts != 0 { // padding copies read it too
		t.Errorf("broken sample read %d times, want a multiple of %d", n, readAttempts)
	}
}

// TestPixelsInFlightBounded: the preprocessing workers never decode more
// pixels at once than MaxPixelsInFlight, and still finish the plan.
func TestPixelsInFlightBounded(t *testing.T) {
	cfg := testConfig(corpus(t, 80, "jsonl"))
	cfg.Workers = 4
	prep, err := Prepare(context.Background(), cfg, nil)
	mustOK(t, err)
	defer prep.Close()
	plan, err := prep.Plan(balancer.StrategyMmfeed)
	mustOK(t, err)
	run := func(budget int64) (peak int64, steps int) {
		prep.Config.MaxPixelsInFlight = budget
		pp, err := NewPreprocessor(prep)
		mustOK(t, err)
		mustOK(t, pp.Run(context.Background(), plan, func(StepBatch) error { steps++; return nil }))
		return pp.peakInFlight.Load(), steps
	}
	free, _ := run(1 << 40)
	if free == 0 {
		t.Fatal("no pixels decoded")
	}
	budget := free / 2
	peak, steps := run(budget)
	if peak > budget {
		t.Errorf("peak %d pixels in flight > budget %d", peak, budget)
	}
	if steps != len(plan.Steps) {
		t.Errorf("%d steps emitted, want %d", steps, len(plan.Steps))
	}
	t.Logf("peak pixels in flight: %d unbounded, %d with a budget of %d", free, peak, budget)
}
