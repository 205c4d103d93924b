package balancer

import (
	"fmt"
	"strconv"
	"testing"
)

// Under SyncMicroBatch a rank's micro-batches run costliest first, so the
// micro-batches at one position are alike on every rank.
func TestSyncMicroBatchOrdersCostliestFirst(t *testing.T) {
	cfg := DefaultConfig()
	p, err := Build(genItems(128*8, genDynamic, 5), cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := cfg.model()
	for _, s := range p.Steps {
		for r, rank := range s.Ranks {
			for j := 1; j < len(rank); j++ {
				prev := cfg.Placement.StepCost(m.CostOf(p.MicroBatchFeatures(rank[j-1])))
				cur := cfg.Placement.StepCost(m.CostOf(p.MicroBatchFeatures(rank[j])))
				if cur > prev {
					t.Fatalf("step %d rank %d: micro-batch %d costs %v > micro-batch %d's %v", s.Index, r, j, cur, j-1, prev)
				}
			}
		}
	}
}

// Identical samples are cut into micro-batches of equal size: any other cut
// costs the same in total but makes the ranks wait at every micro-batch.
func TestSyncMicroBatchEqualSizesForEqualItems(t *testing.T) {
	items := make([]Item, 64*4)
	for i := range items {
		items[i] = Item{ID: strconv.Itoa(i), TextTokens: 20, ImageTokens: 196, Complexity: 1}
	}
	for _, tc := range []struct{ dp, mb, gb int }{{2, 8, 64}, {4, 4, 64}, {2, 3, 48}} {
		t.Run(fmt.Sprintf("dp=%d/mb=%d", tc.dp, tc.mb), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DP, cfg.MicroBatches, cfg.GlobalBatch = tc.dp, tc.mb, tc.gb
			p, err := Build(items, cfg)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.gb / (tc.dp * tc.mb)
			for _, s := range p.Steps {
				for r, rank := range s.Ranks {
					for j, mb := range rank {
						if len(mb) != want {
							t.Fatalf("step %d rank %d micro-batch %d: %d samples, want %d", s.Index, r, j, len(mb), want)
						}
					}
				}
			}
		})
	}
}

// Planning for the synchronisation the trainer has pays: a plan built for
// SyncStep, run by a trainer that meets at every micro-batch, costs more
// than the plan built for SyncMicroBatch, and both beat random.
func TestSyncMicroBatchBeatsStepPlan(t *testing.T) {
	for _, kind := range []genKind{genFixed, genDynamic} {
		t.Run(fmt.Sprint(kind), func(t *testing.T) {
			items := genItems(128*20, kind, 11)
			cost := map[string]float64{}
			for name, tc := range map[string]struct {
				plan Sync
				s    Strategy
			}{"micro-batch": {SyncMicroBatch, StrategyMmfeed}, "step": {SyncStep, StrategyMmfeed}, "random": {SyncMicroBatch, StrategyRandom}} {
				cfg := DefaultConfig()
				cfg.Sync, cfg.Strategy = tc.plan, tc.s
				p, err := Build(items, cfg)
				if err != nil {
					t.Fatal(err)
				}
				p.Config.Sync = SyncMicroBatch // the trainer's synchronisation
				cost[name] = Summarize(p.Stats()).StepCostSum
			}
			if !(cost["micro-batch"] < cost["step"] && cost["step"] < cost["random"]) {
				t.Errorf("step cost sums micro-batch %.4g, step %.4g, random %.4g: want increasing", cost["micro-batch"], cost["step"], cost["random"])
			}
			t.Logf("random / micro-batch plan %.3f×, step plan / micro-batch plan %.3f×",
				cost["random"]/cost["micro-batch"], cost["step"]/cost["micro-batch"])
		})
	}
}
