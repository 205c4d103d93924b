package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader/synth"
	"github.com/mmfeed/mmfeed/pipeline"
)

// benchPartition: milliseconds to plan one global batch, median of partitionRuns.
// The size: 4,096 samples onto 64 ranks (2 micro-batches each), long-tailed
// caption lengths and dynamic-resolution image tokens, padded and packed (--pack).
// partition_*: Partitioner.Partition on one core like every section, its CPU time, and on
// every core (the partitioner builds its candidates concurrently), and the plan's
// imbalance (partitionImbalance), so that a faster partitioner shows it plans as well. plan_step_*: the whole
// plan of that one step (balancer.Build) under mmfeed over the baseline sampler (random)
// in the same run. Then the real corpus at dp 8 × global batch 128 (benchPartitionReal).
func benchPartition(env *benchEnv) (map[string]float64, error) {
	out := map[string]float64{}
	items := partitionItems()
	for _, pack := range []bool{false, true} {
		suffix := ""
		if pack {
			suffix = "_packed"
		}
		one, err := timePartition(items, pack)
		if err != nil {
			return nil, err
		}
		runtime.GOMAXPROCS(runtime.NumCPU())
		all, err := timePartition(items, pack)
		runtime.GOMAXPROCS(1)
		if err != nil {
			return nil, err
		}
		key := "partition_4096_on_64_ranks" + suffix
		out[key+"_ms"], out[key+"_cpu_ms"], out[key+"_all_cores_ms"] = one.wallMs, one.cpuMs, all.wallMs
		out[key+"_imbalance"] = one.imbalance
		cfg := balancer.DefaultConfig()
		cfg.DP, cfg.MicroBatches, cfg.GlobalBatch, cfg.Pack = 64, 2, len(items), pack
		mm, rnd, err := timeBuilds(items, cfg)
		if err != nil {
			return nil, err
		}
		key = "plan_step_4096_on_64_ranks" + suffix
		out[key+"_ms"], out[key+"_random_ms"], out[key+"_over_random"] = mm.wallMs, rnd.wallMs, mm.wallMs/rnd.wallMs
		out[key+"_cpu_ms"] = mm.cpuMs
	}
	real, err := benchPartitionReal(env)
	if err != nil {
		return nil, err
	}
	maps.Copy(out, real)
	return out, nil
}

// timePartition times Partitioner.Partition of items on 64 ranks × 2 micro-batches and
// reports the plan's imbalance (partitionImbalance).
func timePartition(items []balancer.Item, pack bool) (planTiming, error) {
	cfg := balancer.DefaultPartitionConfig()
	cfg.DP, cfg.MicroBatches, cfg.Pack = 64, 2, pack
	p, err := balancer.NewPartitioner(cfg)
	if err != nil {
		return planTiming{}, err
	}
	model, _ := balancer.NewCostModel(balancer.TinyShape())
	costs := model.Costs(items)
	var wall []float64
	var a balancer.Assignment
	c0 := cpuTime()
	for range partitionRuns {
		t0 := time.Now()
		if a, err = p.Partition(items, costs); err != nil {
			return planTiming{}, err
		}
		wall = append(wall, float64(time.Since(t0).Microseconds())/1000)
	}
	cpu := float64((cpuTime() - c0).Microseconds()) / 1000 / partitionRuns
	slices.Sort(wall)
	return planTiming{wall[len(wall)/2], cpu, partitionImbalance(cfg, model, items, costs, a)}, nil
}

// partitionImbalance is the step cost Partition minimises over the mean rank cost: each
// micro-batch priced padded (or packed, with the per-micro-batch overhead), the step cost
// under the configured sync (with micro-batch sync at least Σ over positions of the
// costliest micro-batch there), the mean over ranks of their sums. 1 is even.
func partitionImbalance(cfg balancer.PartitionConfig, model balancer.CostModel, items []balancer.Item,
	costs []balancer.Cost, a balancer.Assignment) float64 {
	slots := make([][]float64, a.DP)
	var total float64
	for r := range slots {
		for m := range a.MicroBatches {
			var f balancer.Features
			var mb []balancer.Item
			count, maxL, maxP, cplx := 0, 0, 0, 0.0
			for _, pos := range a.MicroBatch(r, m) {
				it := items[pos]
				mb = append(mb, it)
				count, maxL, maxP, cplx = count+1, max(maxL, it.TextTokens), max(maxP, it.ImageTokens), cplx+it.Complexity
			}
			if cfg.Pack {
				f = balancer.PackedFeatures(mb)
			} else {
				f = balancer.PaddedFeatures(count, maxL, maxP, cplx)
			}
			c := cfg.Placement.StepCost(model.MicroBatchCost(f, cfg.Pack))
			slots[r] = append(slots[r], c)
			total += c
		}
		slices.SortFunc(slots[r], func(x, y float64) int { return cmp.Compare(y, x) })
	}
	return balancer.PipelineStepCost(slots, 1, cfg.Sync) / (total / float64(a.DP))
}

// partitionRuns is how many times each plan is timed (the median is reported).
const partitionRuns = 30

func partitionItems() []balancer.Item {
	rng := rand.New(rand.NewPCG(1, 2))
	items := make([]balancer.Item, 4096)
	for i := range items {
		items[i] = balancer.Item{
			ID:          fmt.Sprint(i),
			TextTokens:  min(128, 4+int(math.Exp(rng.NormFloat64()*0.9+3))),
			ImageTokens: 64 + rng.IntN(960),
			Complexity:  rng.Float64(),
		}
	}
	return items
}

// planTiming is the median wall time of a plan and its mean CPU time (every thread), and
// for a partition its imbalance (partitionImbalance).
type planTiming struct{ wallMs, cpuMs, imbalance float64 }

// timeBuilds plans items with cfg under mmfeed and under random, alternating, so that
// both see the same machine load, and returns their timings.
func timeBuilds(items []balancer.Item, cfg balancer.Config) (mm, rnd planTiming, err error) {
	var wall [2][]float64
	var cpu [2]time.Duration
	for range partitionRuns {
		for i, s := range []balancer.Strategy{balancer.StrategyMmfeed, balancer.StrategyRandom} {
			c := cfg
			c.Strategy = s
			c0, t0 := cpuTime(), time.Now()
			if _, err := balancer.Build(items, c); err != nil {
				return mm, rnd, err
			}
			wall[i] = append(wall[i], float64(time.Since(t0).Microseconds())/1000)
			cpu[i] += cpuTime() - c0
		}
	}
	t := func(i int) planTiming {
		slices.Sort(wall[i])
		return planTiming{wall[i][len(wall[i])/2], float64(cpu[i].Microseconds()) / 1000 / partitionRuns, 0}
	}
	return t(0), t(1), nil
}

// benchPartitionReal: the real corpus (or a generated one) planned at dp 8 × global
// batch 128, 2 micro-batches per rank, padded and packed: milliseconds per step under
// mmfeed and under random (the whole epoch's plan over its steps).
func benchPartitionReal(env *benchEnv) (map[string]float64, error) {
	input, label, err := benchInput(env, 4000)
	if err != nil {
		return nil, err
	}
	cfg := pipeline.DefaultConfig()
	cfg.Input = input
	prep, err := pipeline.Prepare(context.Background(), cfg, io.Discard)
	if err != nil {
		return nil, err
	}
	defer prep.Close()
	items := prep.Features.Items
	out := map[string]float64{}
	for _, pack := range []bool{false, true} {
		key := "plan_step_" + label
		if pack {
			key += "_packed"
		}
		c := cfg.Plan
		c.DP, c.MicroBatches, c.GlobalBatch, c.Pack = 8, 2, 128, pack
		mm, rnd, err := timeBuilds(items, c)
		if err != nil {
			return nil, err
		}
		steps := float64((len(items) + c.GlobalBatch - 1) / c.GlobalBatch)
		out[key+"_ms"], out[key+"_random_ms"] = mm.wallMs/steps, rnd.wallMs/steps
		out[key+"_cpu_ms"] = mm.cpuMs / steps
		out[key+"_over_random"] = mm.wallMs / rnd.wallMs
	}
	return out, nil
}

// planSetting is one layout benchPlanQuality reports, named in its keys.
type planSetting struct {
	name, policy string
	tune         func(*balancer.Config)
}

// planSettings: dp 8 × global batch 128 padded and packed (--pack) for the default resize
// policy and dynamic, and the packed dynamic-resolution layout whose steps are defined by
// tokens (dp 4 × 2 micro-batches × 8,192 tokens, 40,960 tokens per step).
func planSettings() []planSetting {
	batch := func(pack bool) func(*balancer.Config) {
		return func(c *balancer.Config) { c.DP, c.GlobalBatch, c.Pack = 8, 128, pack }
	}
	tokens := func(c *balancer.Config) {
		c.DP, c.MicroBatches, c.GlobalBatch, c.GlobalTokens, c.Pack = 4, 2, 0, 40960, true
		c.Budget.MaxTokens = 8192
	}
	return []planSetting{
		{"shorter-crop", "shorter-crop", batch(false)}, {"dynamic", "dynamic", batch(false)},
		{"shorter-crop_packed", "shorter-crop", batch(true)}, {"dynamic_packed", "dynamic", batch(true)},
		{"dynamic_tokens_packed", "dynamic", tokens},
	}
}

// benchPlanQuality: imbalance, padding and epoch efficiency of every strategy on the real
// corpus (or a generated one) for every planSetting.
func benchPlanQuality(env *benchEnv) (map[string]float64, error) {
	input, label, err := benchInput(env, 4000)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, ps := range planSettings() {
		cfg := pipeline.DefaultConfig()
		cfg.Input = input
		cfg.Image.Policy = ps.policy
		ps.tune(&cfg.Plan)
		prep, err := pipeline.Prepare(context.Background(), cfg, io.Discard)
		if err != nil {
			return nil, err
		}
		rep, err := prep.Report()
		prep.Close()
		if err != nil {
			return nil, err
		}
		for name, s := range rep.Strategies {
			k := fmt.Sprintf("plan_%s_%s_%s_", label, ps.name, name)
			out[k+"imb_p50"] = s.ImbalanceP50
			out[k+"imb_p99"] = s.ImbalanceP99
			out[k+"padding_eff"] = s.PaddingEfficiency
			out[k+"epoch_eff"] = s.EpochEfficiency
		}
		if mm, ok := rep.Strategies["mmfeed"]; ok && mm.CostLowerBoundSum > 0 {
			out[fmt.Sprintf("plan_%s_%s_mmfeed_epoch_eff_bound", label, ps.name)] = mm.EpochEfficiencyBound
			out[fmt.Sprintf("plan_%s_%s_mmfeed_imb_bound_p99", label, ps.name)] = mm.ImbalanceLowerBoundP99
		}
		out[fmt.Sprintf("plan_%s_%s_speedup_vs_random", label, ps.name)] = rep.SpeedupVsRandom
	}
	return out, nil
}

// benchReport1M: seconds for `report` (index, tokenize, header reads, plan, baselines) on a
// 1,000,000-line manifest, one core. The lines reuse the corpus images (each header is
// still read) with every caption of the corpus, and distinct ids.
func benchReport1M(env *benchEnv) (map[string]float64, error) {
	input, label, err := benchInput(env, 2000)
	if err != nil {
		return nil, err
	}
	big := filepath.Join(filepath.Dir(input), "manifest-1m.jsonl")
	if err := writeBigManifest(input, big, 1_000_000); err != nil {
		return nil, err
	}
	defer os.Remove(big)
	cfg := pipeline.DefaultConfig()
	cfg.Input = big
	cfg.Workers = 1
	start, cpu0 := time.Now(), cpuTime()
	prep, err := pipeline.Prepare(context.Background(), cfg, io.Discard)
	if err != nil {
		return nil, err
	}
	defer prep.Close()
	prepSec, prepCPU := time.Since(start).Seconds(), (cpuTime() - cpu0).Seconds()
	if _, err := prep.Report(); err != nil {
		return nil, err
	}
	total := time.Since(start).Seconds()
	fmt.Printf("   1,000,000 lines over the %s images: features %.1fs (%.1f CPU-s: %.0f µs a sample on one worker core), planning 3 strategies %.1fs\n",
		label, prepSec, prepCPU, prepCPU, total-prepSec)
	// The feature pass per worker core (issue 21): index scan, image headers, tokenization,
	// cost features, with cfg.Workers = 1; CPU time, which moves less with the load.
	return map[string]float64{"report_1m_lines_seconds": total, "report_1m_features_seconds": prepSec,
		"feature_pass_cpu_us_per_sample": prepCPU}, nil // CPU-seconds per 1M samples = µs a sample
}

// benchInput is the real corpus manifest when MMFEED_CORPUS is set, else a generated one.
func benchInput(env *benchEnv, n int) (path, label string, err error) {
	if env.corpus != "" {
		return filepath.Join(env.corpus, "dev", "manifest.jsonl"), "real", nil
	}
	dir := filepath.Join(env.tmp, fmt.Sprintf("synth-%d", n))
	if _, err := os.Stat(filepath.Join(dir, "manifest.jsonl")); err == nil {
		return filepath.Join(dir, "manifest.jsonl"), "synth", nil
	}
	cfg := synth.DefaultConfig()
	cfg.Out, cfg.Samples, cfg.Seed = dir, n, 1
	sum, err := synth.Generate(context.Background(), cfg)
	return sum.Path, "synth", err
}

func writeBigManifest(src, dst string, n int) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	type line struct {
		Image string `json:"image"`
		Text  string `json:"text"`
		ID    string `json:"id,omitempty"`
	}
	var lines []line
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var l line
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			lines = append(lines, l)
		}
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(out, 1<<20)
	enc := json.NewEncoder(w)
	for i := range n {
		l := lines[i%len(lines)]
		l.Text = lines[(i*7919)%len(lines)].Text
		l.ID = fmt.Sprintf("s%07d", i)
		if err := enc.Encode(l); err != nil {
			return err
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return out.Close()
}
