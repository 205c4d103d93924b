package epochs

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
)

// TestNoBaselinesPlansOnce: without baselines an epoch's report holds the
// job's strategy only (each epoch is planned once, not once per strategy);
// by default it compares every strategy.
func TestNoBaselinesPlansOnce(t *testing.T) {
	in := corpus(t, 64)
	for _, tt := range []struct {
		name        string
		noBaselines bool
		want        []string
	}{
		{"default", false, []string{"length_grouped", "mmfeed", "random"}},
		{"none", true, []string{"random"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t, in, 2)
			cfg.Pipeline.Plan.Strategy = balancer.StrategyRandom
			cfg.NoBaselines = tt.noBaselines
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ep, err := PrepareWhole(ctx, cfg, 0, nil, cfg.Pipeline.Plan.Model)
			if err != nil {
				t.Fatal(err)
			}
			defer ep.Close()
			_, _, report, _ := ep.Planning()
			got := slices.Sorted(maps.Keys(report.Strategies))
			if !slices.Equal(got, tt.want) {
				t.Errorf("report strategies %v, want %v", got, tt.want)
			}
		})
	}
}
