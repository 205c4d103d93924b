package balancer

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestSimulateStragglerGrowsWithRanks: with a skewed corpus, random's imbalance grows with
// the number of ranks (the slowest of more ranks is slower), so the simulated benefit of
// balancing grows too, while mmfeed stays near 1.
func TestSimulateStragglerGrowsWithRanks(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	items := make([]Item, 2000)
	for i := range items {
		l := 8 + rng.IntN(24)
		if rng.IntN(10) == 0 {
			l = 128
		}
		items[i] = Item{ID: strconv.Itoa(i), TextTokens: l, ImageTokens: 64 + rng.IntN(900), Complexity: rng.Float64()}
	}
	// Padded cost; the refinement's work is bounded at 4,096 samples. Meeting
	// at every micro-batch leaves each position's few samples to even out.
	bound := map[Sync]float64{SyncStep: 1.06, SyncMicroBatch: 1.12}
	cfg := DefaultConfig()
	cfg.MicroBatches = 2
	for _, sync := range []Sync{SyncStep, SyncMicroBatch} {
		cfg.Sync = sync
		res, err := Simulate(items, cfg, SimulateConfig{Ranks: []int{8, 64, 256}, PerRank: 16, Steps: 4, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != 3 {
			t.Fatalf("got %d results, want 3", len(res))
		}
		for i, r := range res {
			if r.StepTimeRandomOverMmfeed < 1 {
				t.Errorf("sync %v, ranks %d: random/mmfeed = %.3f < 1", sync, r.Ranks, r.StepTimeRandomOverMmfeed)
			}
			if r.MmfeedImbalanceP99 > bound[sync] {
				t.Errorf("sync %v, ranks %d: mmfeed imbalance p99 %.3f > %v", sync, r.Ranks, r.MmfeedImbalanceP99, bound[sync])
			}
			if i > 0 && r.RandomImbalanceP50 <= res[i-1].RandomImbalanceP50 {
				t.Errorf("sync %v: random imbalance p50 did not grow from %d ranks (%.3f) to %d (%.3f)",
					sync, res[i-1].Ranks, res[i-1].RandomImbalanceP50, r.Ranks, r.RandomImbalanceP50)
			}
		}
	}
	if _, err := Simulate(items, cfg, SimulateConfig{Ranks: []int{8}, PerRank: 1}); err == nil {
		t.Errorf("PerRank below micro-batches accepted")
	}
}
