package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader/synth"
	"github.com/mmfeed/mmfeed/pipeline"
)

// benchPartition: milliseconds to partition one global batch of 4,096 samples onto 64
// ranks (2 micro-batches each), median of 30, with long-tailed caption lengths and
// dynamic-resolution image tokens: padded, and packed (--pack).
func benchPartition(env *benchEnv) (map[string]float64, error) {
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
	model, _ := balancer.NewCostModel(balancer.TinyShape())
	costs := model.Costs(items)
	out := map[string]float64{}
	for key, pack := range map[string]bool{"partition_4096_on_64_ranks_ms": false, "partition_4096_on_64_ranks_packed_ms": true} {
		cfg := balancer.DefaultPartitionConfig()
		cfg.DP, cfg.MicroBatches, cfg.Pack = 64, 2, pack
		p, err := balancer.NewPartitioner(cfg)
		if err != nil {
			return nil, err
		}
		var ms []float64
		for range 30 {
			start := time.Now()
			if _, err := p.Partition(items, costs); err != nil {
				return nil, err
			}
			ms = append(ms, float64(time.Since(start).Microseconds())/1000)
		}
		slices.Sort(ms)
		out[key] = ms[len(ms)/2]
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
	start := time.Now()
	prep, err := pipeline.Prepare(context.Background(), cfg, io.Discard)
	if err != nil {
		return nil, err
	}
	defer prep.Close()
	prepSec := time.Since(start).Seconds()
	if _, err := prep.Report(); err != nil {
		return nil, err
	}
	total := time.Since(start).Seconds()
	fmt.Printf("   1,000,000 lines over the %s images: features %.1fs, planning 3 strategies %.1fs\n", label, prepSec, total-prepSec)
	return map[string]float64{"report_1m_lines_seconds": total}, nil
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
