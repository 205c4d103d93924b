package balancer

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// packedCase is one of the packed settings: fixed-count steps (dp 8 ×
// global batch 128) or token-defined steps with micro-batches large enough
// that the largest image fills at most about half of one.
type packedCase struct {
	name  string
	kind  genKind
	tuned func(*Config)
}

func packedCases() []packedCase {
	fixedCount := func(c *Config) { c.DP, c.GlobalBatch = 8, 128 }
	byTokens := func(c *Config) {
		c.DP, c.MicroBatches, c.GlobalBatch = 4, 2, 0
		c.Budget.MaxTokens = 8192
		c.GlobalTokens = 4 * 2 * 8192 * 5 / 8
	}
	return []packedCase{
		{"fixed/batch128", genFixed, fixedCount},
		{"dynamic/batch128", genDynamic, fixedCount},
		{"dynamic/tokens", genDynamic, byTokens},
		{"lumpy/tokens", genLumpy, byTokens},
	}
}

// The packed targets: imbalance p50 ≤ 1.01, p99 ≤ 1.03 and epoch
// efficiency ≥ 0.97 on synthetic skew, fixed and dynamic resolution, both
// placements and syncs.
func TestPackedQualityTargets(t *testing.T) {
	for _, pc := range packedCases() {
		for _, pl := range []Placement{Colocated, Modality} {
			for _, sync := range []Sync{SyncMicroBatch, SyncStep} {
				t.Run(fmt.Sprintf("%s/%v/sync=%v", pc.name, pl, sync), func(t *testing.T) {
					cfg := DefaultConfig()
					cfg.Pack, cfg.Placement, cfg.Sync = true, pl, sync
					pc.tuned(&cfg)
					r, err := Compare(genItems(128*100, pc.kind, 7), cfg)
					if err != nil {
						t.Fatal(err)
					}
					mm, rnd := r.Strategies["mmfeed"], r.Strategies["random"]
					gap := mm.StepCostSum / mm.CostLowerBoundSum
					t.Logf("steps %d imb p50 %.4f p99 %.4f max %.4f, epoch eff %.4f (bound %.4f, gap %.4f, p99 %.4f; bound p99 %.4f); random p99 %.4f eff %.4f",
						mm.Steps, mm.ImbalanceP50, mm.ImbalanceP99, mm.ImbalanceMax, mm.EpochEfficiency, mm.EpochEfficiencyBound, gap, mm.CostOverBoundP99, mm.ImbalanceLowerBoundP99,
						rnd.ImbalanceP99, rnd.EpochEfficiency)
					// Where no split can reach 1.03 (lumpy: several 4-megapixel
					// images in a step), the bound must say so and the plan
					// must be within 1% of it.
					if p99 := max(1.03, mm.ImbalanceLowerBoundP99*1.01); mm.ImbalanceP50 > 1.01 || mm.ImbalanceP99 > p99 {
						t.Errorf("imbalance p50 %.4f p99 %.4f, want ≤ 1.01, %.4f", mm.ImbalanceP50, mm.ImbalanceP99, p99)
					}
					if gap > 1.01 {
						t.Errorf("step cost sum %.4f× its lower bound, want ≤ 1.01", gap)
					}
					if mm.EpochEfficiency < 0.97 {
						t.Errorf("epoch efficiency %.4f < 0.97 (bound %.4f)", mm.EpochEfficiency, mm.EpochEfficiencyBound)
					}
					if mm.EpochEfficiency > mm.EpochEfficiencyBound+1e-12 {
						t.Errorf("epoch efficiency %.6f above its bound %.6f", mm.EpochEfficiency, mm.EpochEfficiencyBound)
					}
				})
			}
		}
	}
}

// TestPackedPlanGolden pins a small packed plan (refresh with -update).
func TestPackedPlanGolden(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DP, cfg.MicroBatches, cfg.GlobalBatch, cfg.Lookahead = 3, 2, 0, 2
	cfg.GlobalTokens, cfg.Budget.MaxTokens, cfg.Pack, cfg.Tail = 6000, 2048, true, TailPad
	p, err := Build(genItems(3*24+5, genDynamic, 42), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := p.WriteJSONL(&buf); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "plan_mmfeed_packed.jsonl")
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("packed plan differs from %s (run with -update if intended)", golden)
	}
}

// Every packed micro-batch stays within Budget.MaxTokens and every step's
// real tokens (text + image) within GlobalTokens.
func TestPackedBudgets(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Pack, cfg.DP, cfg.MicroBatches, cfg.GlobalBatch = true, 4, 2, 0
	cfg.Budget = Budget{MaxTokens: 4096, MaxSamples: 40}
	cfg.GlobalTokens = 4 * 2 * 4096 * 3 / 4
	items := genItems(3000, genDynamic, 3)
	p, err := Build(items, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.Steps {
		step := 0
		for _, rank := range s.Ranks {
			for _, mb := range rank {
				tokens := 0
				for _, e := range mb {
					tokens += items[e.Item].TextTokens + items[e.Item].ImageTokens
				}
				step += tokens
				if tokens > cfg.Budget.MaxTokens || len(mb) > cfg.Budget.MaxSamples || len(mb) == 0 {
					t.Fatalf("step %d: micro-batch of %d entries, %d tokens breaks %+v", s.Index, len(mb), tokens, cfg.Budget)
				}
			}
		}
		if step > cfg.GlobalTokens {
			t.Fatalf("step %d: %d tokens > global tokens %d", s.Index, step, cfg.GlobalTokens)
		}
	}
}

func TestPackedConfigErrors(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"padded tokens under pack": func(c *Config) { c.Pack, c.Budget.MaxPaddedTokens = true, 100 },
		"packed tokens unpacked":   func(c *Config) { c.Budget.MaxTokens = 100 },
		"negative packed tokens":   func(c *Config) { c.Pack, c.Budget.MaxTokens = true, -1 },
		"negative overhead":        func(c *Config) { c.Model = c.model(); c.Model.MicroBatchOverhead.Text = -1 },
	} {
		cfg := DefaultConfig()
		mut(&cfg)
		if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: got %v, want ErrInvalidConfig", name, err)
		}
	}
	cfg := DefaultConfig()
	cfg.Pack, cfg.Budget.MaxTokens = true, 300
	if _, err := NewPartitioner(cfg.partitionConfig()); err != nil {
		t.Fatal(err)
	}
	p, _ := NewPartitioner(cfg.partitionConfig())
	items := genItems(128, genFixed, 1) // ≈ 220 tokens each: 32 bins of 300 cannot hold 128
	if _, err := p.Partition(items, cfg.model().Costs(items)); !errors.Is(err, ErrBudgetExceeded) {
		t.Errorf("got %v, want ErrBudgetExceeded", err)
	}
}

// StepCostLowerBound never exceeds the step cost of any split: checked
// against random and balanced splits of small steps, padded and packed.
func TestStepCostLowerBoundIsABound(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	m, _ := NewCostModel(TinyShape())
	for trial := range 300 {
		dp, mbs := 1+rng.IntN(4), 1+rng.IntN(3)
		items := genItems(dp*mbs+rng.IntN(12), []genKind{genFixed, genDynamic, genLumpy}[trial%3], uint64(trial))
		for _, pack := range []bool{false, true} {
			for _, sync := range []Sync{SyncMicroBatch, SyncStep} {
				for _, pl := range []Placement{Colocated, Modality} {
					cfg := DefaultConfig()
					cfg.DP, cfg.MicroBatches, cfg.GlobalBatch, cfg.Pack, cfg.Sync, cfg.Placement = dp, mbs, len(items), pack, sync, pl
					cfg.Model = m
					cfg.Model.MicroBatchOverhead = Cost{Vision: 0.01 * float64(trial%2)}
					for _, s := range []Strategy{StrategyMmfeed, StrategyRandom} {
						cfg.Strategy = s
						p, err := Build(items, cfg)
						if err != nil {
							t.Fatal(err)
						}
						for _, st := range p.Stats() {
							if st.CostLowerBound > st.MaxCost*(1+1e-9) {
								t.Fatalf("trial %d %v pack=%v sync=%v %v: bound %v > step cost %v", trial, s, pack, sync, pl, st.CostLowerBound, st.MaxCost)
							}
						}
					}
				}
			}
		}
	}
}

// TestPackedGeneratorsHeapMatchesScan: under an unlimited budget packLevels
// and packLPT take the cheapest bin from a heap; a budget no bin reaches
// makes them scan every bin instead, and the bins must be the same. The
// cases include tied costs, free samples (cost 0) and negative costs (which
// no cost model gives, but a caller may pass), where a filled bin can cost
// no more than an empty one.
func TestPackedGeneratorsHeapMatchesScan(t *testing.T) {
	for _, tc := range []struct {
		name  string
		kind  genKind
		odd   int // every odd-th sample's cost is scaled by scale (0: none)
		scale float64
		dp, m int
	}{
		{"dynamic", genDynamic, 0, 0, 16, 2},
		{"fixed ties", genFixed, 0, 0, 8, 4},
		{"free samples", genFixed, 3, 0, 8, 2},
		{"negative costs", genDynamic, 2, -1, 8, 2},
		{"negative costs, 3 positions", genDynamic, 4, -0.5, 8, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items := genItems(512, tc.kind, 7)
			for _, pl := range []Placement{Colocated, Modality} {
				cfg := DefaultPartitionConfig()
				cfg.DP, cfg.MicroBatches, cfg.Placement, cfg.Pack = tc.dp, tc.m, pl, true
				costs := cfg.model().Costs(items)
				for i, c := range costs {
					if tc.odd > 0 && i%tc.odd == 0 {
						costs[i] = Cost{c.Vision * tc.scale, c.Text * tc.scale, c.Fusion * tc.scale}
					}
				}
				bins := func(budget Budget) ([][]int32, [][]int32) {
					cfg.Budget = budget
					p, err := NewPartitioner(cfg)
					if err != nil {
						t.Fatal(err)
					}
					jb := p.newJob(items, costs)
					order := jb.packOrder()
					return jb.packLevels(order), jb.packLPT(order)
				}
				levels, lpt := bins(Budget{})
				levelsScan, lptScan := bins(Budget{MaxSamples: len(items)})
				if (levels == nil) != (levelsScan == nil) || !slices.EqualFunc(levels, levelsScan, slices.Equal) {
					t.Errorf("%v: packLevels from the heap differs from the scan", pl)
				}
				if (lpt == nil) != (lptScan == nil) || !slices.EqualFunc(lpt, lptScan, slices.Equal) {
					t.Errorf("%v: packLPT from the heap differs from the scan", pl)
				}
			}
		})
	}
}
