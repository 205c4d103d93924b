package balancer

import (
	"errors"
	"fmt"
	"math"
	"testing"
)

func TestPipelineStepCost(t *testing.T) {
	tests := []struct {
		name  string
		slots [][]float64
		pp    int
		sync  Sync
		want  float64
	}{
		{"pp 1 is the rank sum", [][]float64{{3, 1}, {2, 2}}, 1, SyncStep, 4},
		{"pp 1 micro-batch sync: Σ position maxima", [][]float64{{3, 1}, {1, 3}}, 1, SyncMicroBatch, 6},
		{"pp 2: (Σ + max) / 2", [][]float64{{3, 1}}, 2, SyncStep, 3.5},
		{"pp 4: (Σ + 3 max) / 4", [][]float64{{4, 4, 4, 4}}, 4, SyncStep, 7},
		{"pp 4, one long micro-batch stalls", [][]float64{{10, 2, 2, 2}}, 4, SyncStep, 11.5},
		{"pp 4, the slowest replica sets the step", [][]float64{{4, 4, 4, 4}, {10, 2, 2, 2}}, 4, SyncStep, 11.5},
		{"pp 2 micro-batch sync: positions", [][]float64{{3, 1}, {1, 3}}, 2, SyncMicroBatch, 4.5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := PipelineStepCost(tc.slots, tc.pp, tc.sync); math.Abs(got-tc.want) > 1e-12 {
				t.Fatalf("PipelineStepCost = %v, want %v", got, tc.want)
			}
		})
	}
}

// pipelineCostOf prices an assignment with the pipelined model (each rank's
// micro-batches costliest first, as Assignment orders them).
func pipelineCostOf(t *testing.T, p *Partitioner, items []Item, a Assignment) float64 {
	t.Helper()
	slots := make([][]float64, a.DP)
	for r := range slots {
		for j := range a.MicroBatches {
			var f Features
			var s mbShape
			for _, pos := range a.MicroBatch(r, j) {
				it := items[pos]
				s.add(it)
				f = f.Add(FeaturesOf(it.TextTokens, it.ImageTokens, it.Complexity))
			}
			if !p.cfg.Pack {
				f = s.features()
			}
			slots[r] = append(slots[r], p.cfg.Placement.StepCost(p.model.MicroBatchCost(f, p.cfg.Pack)))
		}
		sortDesc(slots[r])
	}
	return PipelineStepCost(slots, p.cfg.pp(), p.cfg.Sync)
}

// TestPartitionPipelineLevels: under pp > 1 the partitioner's plan costs no
// more, under the pipelined model, than the plan made for pp 1, is strictly
// cheaper on some batches, and keeps every Partition invariant.
func TestPartitionPipelineLevels(t *testing.T) {
	model, err := NewCostModel(TinyShape())
	if err != nil {
		t.Fatal(err)
	}
	gains, ratio, worst := 0, 0.0, 1.0
	for _, pack := range []bool{false, true} {
		for _, sync := range []Sync{SyncMicroBatch, SyncStep} {
			for seed := range uint64(6) {
				name := fmt.Sprintf("pack=%v/sync=%v/seed=%d", pack, sync, seed)
				items := genItems(48, genDynamic, seed)
				costs := model.Costs(items)
				base := PartitionConfig{DP: 2, MicroBatches: 4, PaddingTarget: 0.95, Model: model, Sync: sync, Pack: pack}
				piped := base
				piped.PP = 4
				p1, _ := NewPartitioner(base)
				p4, _ := NewPartitioner(piped)
				a1, err := p1.Partition(items, costs)
				if err != nil {
					t.Fatal(name, err)
				}
				a4, err := p4.Partition(items, costs)
				if err != nil {
					t.Fatal(name, err)
				}
				if !pack {
					checkAssignment(t, items, costs, piped, a4)
				}
				checkCover(t, name, len(items), a4)
				c1, c4 := pipelineCostOf(t, p4, items, a1), pipelineCostOf(t, p4, items, a4)
				if c4 > c1*(1+1e-12) {
					t.Errorf("%s: pp-aware plan costs %.4g > pp-blind plan's %.4g under pp 4", name, c4, c1)
				}
				if c4 < c1*(1-1e-3) {
					gains++
				}
				ratio += c4 / c1
				worst = min(worst, c4/c1)
			}
		}
	}
	if gains == 0 {
		t.Fatal("levelling under pp never lowered the pipelined cost: the pass does nothing")
	}
	t.Logf("pp-aware plan strictly cheaper on %d of 24 batches; pipelined cost / pp-blind plan's: mean %.4f, best %.4f",
		gains, ratio/24, worst)
}

func checkCover(t *testing.T, name string, n int, a Assignment) {
	t.Helper()
	seen := make([]int, n)
	for k, mb := range a.Members {
		if len(mb) == 0 {
			t.Fatalf("%s: micro-batch %d is empty", name, k)
		}
		for _, pos := range mb {
			seen[pos]++
		}
	}
	for i, c := range seen {
		if c != 1 {
			t.Fatalf("%s: position %d placed %d times", name, i, c)
		}
	}
}

// TestPlanStatsPipelined: a plan built for pp 4 reports pipelined step costs
// that stay above their lower bound, and pp is validated.
func TestPlanStatsPipelined(t *testing.T) {
	items := genItems(400, genDynamic, 3)
	cfg := DefaultConfig()
	cfg.DP, cfg.MicroBatches, cfg.GlobalBatch, cfg.PP = 2, 4, 64, 4
	p, err := Build(items, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range p.Stats() {
		if st.MaxCost < st.CostLowerBound*(1-1e-9) {
			t.Fatalf("step %d: max cost %.4g below its lower bound %.4g", st.Step, st.MaxCost, st.CostLowerBound)
		}
		if st.MaxCost < st.IdealCost*(1-1e-9) || st.Imbalance < 1-1e-9 {
			t.Fatalf("step %d: max %.4g, ideal %.4g, imbalance %.4g", st.Step, st.MaxCost, st.IdealCost, st.Imbalance)
		}
	}
	cfg.PP = -1
	if _, err := Build(items, cfg); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("pp -1: err %v, want ErrInvalidConfig", err)
	}
}

// BenchmarkPartitionPipelined: Partition of 4,096 samples on 64 ranks × 4
// micro-batches, pp 1 against pp 4 (the levelling pass's cost).
func BenchmarkPartitionPipelined(b *testing.B) {
	model, _ := NewCostModel(TinyShape())
	items := genItems(4096, genDynamic, 1)
	costs := model.Costs(items)
	for _, pp := range []int{1, 4} {
		b.Run(fmt.Sprintf("pp%d", pp), func(b *testing.B) {
			p, err := NewPartitioner(PartitionConfig{DP: 64, MicroBatches: 4, PaddingTarget: 0.95, Model: model, PP: pp})
			if err != nil {
				b.Fatal(err)
			}
			for range b.N {
				if _, err := p.Partition(items, costs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
