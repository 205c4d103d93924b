package balancer

import (
	"math"
	"slices"
	"testing"
)

// TestStridedCutsMatchGreedy: stridedCuts (by blocks) gives greedyCuts'
// item-by-item cuts (or its nil) at every threshold of a bisection's range, for sorted
// and unsorted orders, tight and loose group counts, with and without a
// budget.
func TestStridedCutsMatchGreedy(t *testing.T) {
	for _, kind := range []genKind{genFixed, genDynamic, genLumpy} {
		items := genItems(700, kind, 5)
		for _, budget := range []Budget{{}, {MaxSamples: 9}, {MaxPaddedTokens: 600, MaxImageTokens: 6000}} {
			cfg := DefaultPartitionConfig()
			cfg.DP, cfg.Budget = 16, budget
			p, err := NewPartitioner(cfg)
			if err != nil {
				t.Fatal(err)
			}
			jb := p.newJob(items, cfg.model().Costs(items))
			if !jb.growingCost {
				t.Fatal("generated items should let greedyCuts stride")
			}
			unsorted := make([]int32, len(items))
			for i := range unsorted {
				unsorted[i] = int32(i)
			}
			for _, order := range [][]int32{jb.sortByLength(), jb.sortByImage(), unsorted} {
				run := cutRun{items: make([]runItem, len(order))}
				var lo, hi float64
				for i, pos := range order {
					it := items[pos]
					run.items[i] = runItem{it.TextTokens, it.ImageTokens, it.Complexity}
					lo = max(lo, perSample(&p.total, it.TextTokens, it.ImageTokens))
					hi += perSample(&p.total, it.TextTokens, it.ImageTokens)
				}
				for _, k := range []int{16, 64, 200} {
					for th := lo / 2; th < 2*hi; th *= 1.07 {
						for _, tt := range []float64{th, math.Inf(1)} {
							strided := slices.Clone(jb.greedyCuts(cutRun{run.items, cutBlocks(run.items)}, tt, k, nil))
							want := jb.greedyCuts(cutRun{items: run.items}, tt, k, nil)
							if (strided == nil) != (want == nil) || !slices.Equal(strided, want) {
								t.Fatalf("%v budget %+v k %d t %g: strided cuts %v, greedy %v", kind, budget, k, tt, strided, want)
							}
						}
					}
				}
			}
		}
	}
}
