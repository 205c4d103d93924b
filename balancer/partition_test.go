package balancer

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// checkAssignment verifies that a covers every position exactly once with
// DP × MicroBatches non-empty micro-batches within the budget, and returns the
// max/mean rank cost and the padding efficiency.
func checkAssignment(t *testing.T, items []Item, costs []Cost, cfg PartitionConfig, a Assignment) (imb, pad float64) {
	t.Helper()
	if a.DP != cfg.DP || a.MicroBatches != cfg.MicroBatches || len(a.Members) != cfg.DP*cfg.MicroBatches {
		t.Fatalf("got %d×%d (%d lists), want %d×%d", a.DP, a.MicroBatches, len(a.Members), cfg.DP, cfg.MicroBatches)
	}
	seen := make([]int, len(items))
	var real, padded int64
	var maxC, sumC float64
	for r := range a.DP {
		var c Cost
		for m := range a.MicroBatches {
			mb := a.MicroBatch(r, m)
			if len(mb) == 0 {
				t.Fatalf("rank %d micro-batch %d is empty", r, m)
			}
			longest, sumP := 0, 0
			for _, pos := range mb {
				seen[pos]++
				longest = max(longest, items[pos].TextTokens)
				sumP += items[pos].ImageTokens
				real += int64(items[pos].TextTokens)
				c = c.Add(costs[pos])
			}
			if !cfg.Budget.Fits(len(mb), longest, sumP) {
				t.Fatalf("rank %d micro-batch %d (n=%d, longest %d, ΣP %d) exceeds budget %+v", r, m, len(mb), longest, sumP, cfg.Budget)
			}
			padded += int64(len(mb)) * int64(longest)
		}
		sc := cfg.Placement.StepCost(c)
		maxC = max(maxC, sc)
		sumC += sc
	}
	for pos, n := range seen {
		if n != 1 {
			t.Fatalf("position %d assigned %d times", pos, n)
		}
	}
	return maxC / (sumC / float64(a.DP)), ratio(real, padded)
}

func TestPartitionProperties(t *testing.T) {
	budgets := []Budget{{}, {MaxSamples: 6}, {MaxPaddedTokens: 300}, {MaxImageTokens: 2048}, {MaxSamples: 5, MaxPaddedTokens: 400, MaxImageTokens: 3000}}
	for _, kind := range []genKind{genFixed, genDynamic} {
		for _, pl := range []Placement{Colocated, Modality} {
			for bi, bud := range budgets {
				for _, shape := range []ModelShape{TinyShape(), BaseShape()} {
					name := fmt.Sprintf("%v/%v/budget=%d/%s", kind, pl, bi, shape.Name)
					t.Run(name, func(t *testing.T) {
						model, _ := NewCostModel(shape)
						cfg := PartitionConfig{DP: 8, MicroBatches: 4, Budget: bud, Placement: pl, PaddingTarget: 0.95}
						p, err := NewPartitioner(cfg)
						if err != nil {
							t.Fatal(err)
						}
						for s := range 5 {
							items := genItems(128+s*7, kind, uint64(100+s))
							costs := model.Costs(items)
							a, err := p.Partition(items, costs)
							if errors.Is(err, ErrBudgetExceeded) && !bud.Unlimited() {
								continue // a tight budget may not hold a batch; checked below
							}
							if err != nil {
								t.Fatal(err)
							}
							checkAssignment(t, items, costs, cfg, a)
							b, err := p.Partition(items, costs)
							if err != nil || !slices.EqualFunc(a.Members, b.Members, slices.Equal) {
								t.Fatalf("second partition differs (err %v)", err)
							}
						}
					})
				}
			}
		}
	}
}

// paddedImbalance returns a's max / mean padded rank step cost.
func paddedImbalance(model CostModel, items []Item, pl Placement, a Assignment) float64 {
	var hi, sum float64
	for r := range a.DP {
		var c Cost
		for m := range a.MicroBatches {
			c = c.Add(paddedCost(model, items, a.MicroBatch(r, m)))
		}
		hi, sum = max(hi, pl.StepCost(c)), sum+pl.StepCost(c)
	}
	return hi / (sum / float64(a.DP))
}

// paddedMax returns the largest padded rank step cost of a.
func paddedMax(model CostModel, items []Item, pl Placement, a Assignment) float64 {
	var hi float64
	for r := range a.DP {
		var c Cost
		for m := range a.MicroBatches {
			c = c.Add(paddedCost(model, items, a.MicroBatch(r, m)))
		}
		hi = max(hi, pl.StepCost(c))
	}
	return hi
}

// The refinement never raises the largest padded rank cost of the best
// unrefined candidate: it refines every candidate and only accepts exchanges
// that do not raise it.
func TestPartitionRefinementLowersPaddedMax(t *testing.T) {
	model, _ := NewCostModel(BaseShape())
	for _, kind := range []genKind{genFixed, genDynamic} {
		for _, pl := range []Placement{Colocated, Modality} {
			for s := range 6 {
				items := genItems(128, kind, uint64(s))
				costs := model.Costs(items)
				base := PartitionConfig{DP: 8, MicroBatches: 4, PaddingTarget: 0.95, Placement: pl, Sync: SyncStep, Model: model, Refinement: RefineNone}
				p0, _ := NewPartitioner(base)
				a0, err := p0.Partition(items, costs)
				if err != nil {
					t.Fatal(err)
				}
				checkAssignment(t, items, costs, base, a0)
				refined := base
				refined.Refinement = RefineLocalSearch
				p1, _ := NewPartitioner(refined)
				a1, err := p1.Partition(items, costs)
				if err != nil {
					t.Fatal(err)
				}
				checkAssignment(t, items, costs, refined, a1)
				got, was := paddedMax(model, items, pl, a1), paddedMax(model, items, pl, a0)
				if got > was*(1+10*minGain) { // ties within minGain keep the earlier candidate
					t.Errorf("%v/%v seed %d: refinement raised the padded max %v → %v", kind, pl, s, was, got)
				}
			}
		}
	}
}

func TestPartitionErrors(t *testing.T) {
	model, _ := NewCostModel(TinyShape())
	items := genItems(20, genFixed, 1)
	costs := model.Costs(items)
	tests := []struct {
		name string
		cfg  PartitionConfig
		in   []Item
		want error
	}{
		{"too few", PartitionConfig{DP: 8, MicroBatches: 4, PaddingTarget: 0.95}, items, ErrTooFewItems},
		{"item over budget", PartitionConfig{DP: 2, MicroBatches: 2, PaddingTarget: 0.95, Budget: Budget{MaxPaddedTokens: 2}}, items, ErrBudgetExceeded},
		{"batch over budget", PartitionConfig{DP: 2, MicroBatches: 2, PaddingTarget: 0.95, Budget: Budget{MaxSamples: 4}}, items, ErrBudgetExceeded},
		{"cost mismatch", PartitionConfig{DP: 1, MicroBatches: 1, PaddingTarget: 0.95}, items[:3], ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPartitioner(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Partition(tt.in, costs)
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
}

// Exactly dp × micro-batches items: one per micro-batch.
func TestPartitionMinimal(t *testing.T) {
	model, _ := NewCostModel(TinyShape())
	items := genItems(12, genDynamic, 9)
	cfg := PartitionConfig{DP: 3, MicroBatches: 4, PaddingTarget: 0.95, Placement: Modality}
	p, _ := NewPartitioner(cfg)
	a, err := p.Partition(items, model.Costs(items))
	if err != nil {
		t.Fatal(err)
	}
	checkAssignment(t, items, model.Costs(items), cfg, a)
	for i, mb := range a.Members {
		if len(mb) != 1 {
			t.Errorf("micro-batch %d has %d entries, want 1", i, len(mb))
		}
	}
}

func BenchmarkPartition(b *testing.B) {
	model, _ := NewCostModel(BaseShape())
	for _, tc := range []struct{ ranks, samples, mbs int }{{8, 128, 4}, {64, 4096, 1}, {64, 4096, 2}, {64, 4096, 4}, {256, 16384, 2}} {
		for _, pl := range []Placement{Colocated, Modality} {
			name := fmt.Sprintf("ranks=%d/samples=%d/mb=%d/placement=%v", tc.ranks, tc.samples, tc.mbs, pl)
			b.Run(name, func(b *testing.B) {
				items := genItems(tc.samples, genDynamic, 1)
				costs := model.Costs(items)
				p, err := NewPartitioner(PartitionConfig{DP: tc.ranks, MicroBatches: tc.mbs, PaddingTarget: 0.95, Placement: pl, Model: model})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				var imb float64
				for b.Loop() {
					a, err := p.Partition(items, costs)
					if err != nil {
						b.Fatal(err)
					}
					imb = paddedImbalance(model, items, pl, a)
				}
				b.ReportMetric(imb, "padded-max/mean")
			})
		}
	}
}

// TestPartitionerSharedByGoroutines: a Partitioner keeps no state between
// calls, so goroutines sharing one get the plans a lone caller gets (run
// with -race to check the sharing too).
func TestPartitionerSharedByGoroutines(t *testing.T) {
	for _, pack := range []bool{false, true} {
		cfg := DefaultPartitionConfig()
		cfg.DP, cfg.MicroBatches, cfg.Pack = 4, 2, pack
		p, err := NewPartitioner(cfg)
		if err != nil {
			t.Fatal(err)
		}
		batches := make([][]Item, 6)
		want := make([]Assignment, len(batches))
		for i := range batches {
			batches[i] = genItems(64+16*i, genKind(i%3), uint64(i))
			if want[i], err = p.Partition(batches[i], cfg.model().Costs(batches[i])); err != nil {
				t.Fatal(err)
			}
		}
		got := make([]Assignment, len(batches))
		var wg sync.WaitGroup
		for i := range batches {
			wg.Go(func() { got[i], _ = p.Partition(batches[i], cfg.model().Costs(batches[i])) })
		}
		wg.Wait()
		for i := range batches {
			if !slices.EqualFunc(got[i].Members, want[i].Members, slices.Equal) {
				t.Errorf("pack=%v batch %d: concurrent plan differs", pack, i)
			}
		}
	}
}
