package balancer

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSortedOrdersMatchComparison: the packed-key orders equal a comparison
// sort by (major, minor, cost, position), and packOrder one by (cost
// descending, position), with tied costs, negative and zero
// costs, and token counts too large for the keys (the fallback).
func TestSortedOrdersMatchComparison(t *testing.T) {
	for _, tc := range []struct {
		name     string
		n, maxTk int
		costs    []float64 // drawn from
	}{
		{"distinct", 500, 128, nil},
		{"tied costs", 500, 8, []float64{1, 2, 2, 3}},
		{"one cost", 100, 8, []float64{7}},
		{"one item", 1, 8, nil},
		{"signed zero and negative", 300, 8, []float64{-1.5, -0.0, 0, 0.25}},
		{"huge tokens", 200, 1 << 22, nil},
		{"too many bits", 50, 1 << 30, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, uint64(tc.n)))
			items := make([]Item, tc.n)
			key := make([]float64, tc.n)
			for i := range items {
				items[i] = Item{TextTokens: rng.IntN(tc.maxTk), ImageTokens: rng.IntN(tc.maxTk)}
				key[i] = rng.Float64()
				if tc.costs != nil {
					key[i] = tc.costs[rng.IntN(len(tc.costs))]
				}
			}
			want := func(major, minor func(Item) int) []int32 {
				out := make([]int32, tc.n)
				for i := range out {
					out[i] = int32(i)
				}
				slices.SortFunc(out, func(x, y int32) int {
					return cmp.Or(cmp.Compare(major(items[x]), major(items[y])), cmp.Compare(minor(items[x]), minor(items[y])),
						cmp.Compare(key[x], key[y]), cmp.Compare(x, y))
				})
				return out
			}
			jb := &job{items: items, ranked: newRankKeys(key)}
			l := func(it Item) int { return it.TextTokens }
			p := func(it Item) int { return it.ImageTokens }
			zero := func(Item) int { return 0 }
			if got := jb.sortByLength(); !slices.Equal(got, want(l, zero)) {
				t.Errorf("sortByLength differs")
			}
			if got := jb.sortByImage(); !slices.Equal(got, want(p, l)) {
				t.Errorf("sortByImage differs")
			}
			if got := costOrder(key); !slices.Equal(got, want(zero, zero)) {
				t.Errorf("costOrder differs")
			}
			costliest := make([]int32, tc.n) // packOrder: (cost descending, position)
			for i := range costliest {
				costliest[i] = int32(i)
			}
			slices.SortFunc(costliest, func(x, y int32) int { return cmp.Or(cmp.Compare(key[y], key[x]), cmp.Compare(x, y)) })
			if got := (&job{items: items, stepCost: key}).packOrder(); !slices.Equal(got, costliest) {
				t.Errorf("packOrder differs")
			}
		})
	}
}
