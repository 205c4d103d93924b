package balancer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestShortcutsMatchFullPricing: the padded pipeline's shortcuts
// (job.shapePriced: swaps not priced twice, levelPositions without
// complexity sums; job.growingCost: strided cuts, swaps only counted when
// none can win) give the plans that pricing every exchange and cut in full
// gives, on layouts other than the fingerprints': sizes 40 to 2,048, both
// syncs and placements, budgets, pp 4.
func TestShortcutsMatchFullPricing(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for i := range 30 {
		n := []int{40, 96, 300, 700, 2048}[i%5]
		cfg := DefaultPartitionConfig()
		cfg.DP = []int{2, 4, 8, 16, 32}[rng.IntN(5)]
		cfg.MicroBatches = []int{1, 2, 3, 4}[rng.IntN(4)]
		for cfg.DP*cfg.MicroBatches*2 > n {
			cfg.DP = max(cfg.DP/2, 1)
		}
		cfg.Sync, cfg.Placement = Sync(rng.IntN(2)), Placement(rng.IntN(2))
		if rng.IntN(4) == 0 {
			cfg.PP = 4
		}
		if rng.IntN(3) == 0 {
			per := 3*n/(cfg.DP*cfg.MicroBatches) + 1
			cfg.Budget = Budget{MaxSamples: per, MaxPaddedTokens: 96 * per, MaxImageTokens: 900 * per}
		}
		kind := genKind(rng.IntN(3))
		t.Run(fmt.Sprintf("n=%d/%v/dp=%d/m=%d/%v/%v/pp=%d/budget=%v", n, kind, cfg.DP, cfg.MicroBatches, cfg.Sync,
			cfg.Placement, cfg.PP, !cfg.Budget.Unlimited()), func(t *testing.T) {
			items := genItems(n, kind, uint64(300+i))
			costs := cfg.model().Costs(items)
			var got [2]Assignment
			var errs [2]error
			for k, full := range []bool{false, true} {
				p, err := NewPartitioner(cfg)
				if err != nil {
					t.Fatal(err)
				}
				p.fullPricing = full
				got[k], errs[k] = p.Partition(items, costs)
			}
			if (errs[0] == nil) != (errs[1] == nil) {
				t.Fatalf("errors differ: %v, %v", errs[0], errs[1])
			}
			if !slices.EqualFunc(got[0].Members, got[1].Members, slices.Equal) {
				t.Errorf("the plan with shortcuts differs from the fully priced one")
			}
		})
	}
}
