package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader/synth"
	"github.com/mmfeed/mmfeed/pipeline"
)

// scaleLayout is one row of the plan_scale table: dp ranks × a global batch of samples,
// planned packed with dynamic resolution (unless padded or fixed say otherwise).
type scaleLayout struct {
	name        string
	dp, batch   int
	micro       int
	big         bool   // the 160k corpus (else the 20k one)
	policy      string // resize policy (default dynamic)
	padded      bool
	compareOnly bool // not part of the growth exponent
}

func scaleLayouts() []scaleLayout {
	return []scaleLayout{
		{name: "dp64_b4096", dp: 64, batch: 4096, micro: 2},
		{name: "dp128_b2048", dp: 128, batch: 2048, micro: 4, big: true},
		{name: "dp512_b8192", dp: 512, batch: 8192, micro: 4, big: true},
		{name: "dp1024_b16384", dp: 1024, batch: 16384, micro: 4, big: true},
		{name: "dp512_b8192_padded", dp: 512, batch: 8192, micro: 4, big: true, padded: true, compareOnly: true},
		{name: "dp512_b8192_fixed", dp: 512, batch: 8192, micro: 4, big: true, policy: "shorter-crop", compareOnly: true},
	}
}

var planScaleOnly = flag.String("plan-scale-layouts", "", "plan_scale: comma-separated layout names to run (default all)")

// benchPlanScale: planning CPU per step, imbalance and epoch efficiency at cluster scale
// (issue 21's table). The corpus is `mmfeed synth --samples 20000 --seed 1`, and for the big
// layouts each of its lines repeated 8× with new ids (160,000 samples). Every layout is
// planned with the mmfeed strategy, lookahead 4, on one core; the CPU seconds of
// balancer.Build over its steps are the planning CPU per step. plan_scale_exponent is the
// slope of log(CPU per step) over log(samples per step) from dp 64 to dp 1024.
func benchPlanScale(env *benchEnv) (map[string]float64, error) {
	small, err := scaleCorpus(env)
	if err != nil {
		return nil, err
	}
	big := filepath.Join(filepath.Dir(small), "manifest-160k.jsonl")
	if err := repeatManifest(small, big, 8); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	type point struct{ samples, cpu float64 }
	var growth []point
	for _, l := range scaleLayouts() {
		if *planScaleOnly != "" && !slices.Contains(strings.Split(*planScaleOnly, ","), l.name) {
			continue
		}
		input := small
		if l.big {
			input = big
		}
		r, err := planScaleRow(input, l)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", l.name, err)
		}
		k := "plan_scale_" + l.name + "_"
		out[k+"cpu_ms_per_step"] = r.cpuMs
		out[k+"imb_p50"], out[k+"imb_p99"] = r.sum.ImbalanceP50, r.sum.ImbalanceP99
		out[k+"epoch_eff"], out[k+"epoch_eff_bound"] = r.sum.EpochEfficiency, r.sum.EpochEfficiencyBound
		out[k+"epoch_eff_window_bound"] = r.windowBound
		fmt.Printf("   %-20s %6d steps  %9.1f ms CPU/step  imb p50 %.4f p99 %.4f  epoch eff %.4f (bound %.4f, window bound %.4f)\n",
			l.name, r.sum.Steps, r.cpuMs, r.sum.ImbalanceP50, r.sum.ImbalanceP99, r.sum.EpochEfficiency, r.sum.EpochEfficiencyBound, r.windowBound)
		if !l.compareOnly {
			growth = append(growth, point{float64(l.batch), r.cpuMs})
		}
	}
	if len(growth) >= 2 {
		a, b := growth[0], growth[len(growth)-1]
		out["plan_scale_exponent"] = math.Log(b.cpu/a.cpu) / math.Log(b.samples/a.samples)
	}
	return out, nil
}

type scaleRow struct {
	cpuMs       float64
	sum         balancer.Summary
	windowBound float64 // epoch efficiency bound over the lookahead windows
}

func planScaleRow(input string, l scaleLayout) (scaleRow, error) {
	cfg := pipeline.DefaultConfig()
	cfg.Input = input
	cfg.Workers = 1
	cfg.Image.Policy = cmpOr(l.policy, "dynamic")
	cfg.Plan.DP, cfg.Plan.GlobalBatch, cfg.Plan.MicroBatches, cfg.Plan.Pack = l.dp, l.batch, l.micro, !l.padded
	prep, err := pipeline.Prepare(context.Background(), cfg, io.Discard)
	if err != nil {
		return scaleRow{}, err
	}
	defer prep.Close()
	c0 := cpuTime()
	plan, err := balancer.Build(prep.Features.Items, cfg.Plan)
	if err != nil {
		return scaleRow{}, err
	}
	cpu := cpuTime() - c0
	sum := balancer.Summarize(plan.Stats())
	row := scaleRow{cpuMs: float64(cpu.Microseconds()) / 1000 / float64(max(1, len(plan.Steps))), sum: sum}
	if wb := plan.WindowLowerBoundSum(); wb > 0 {
		row.windowBound = min(1, sum.EpochEfficiency*sum.StepCostSum/wb)
	}
	return row, nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// scaleCorpus is the generated 20,000-sample corpus of issue 21's recipe (seed 1), made
// once per bench run.
func scaleCorpus(env *benchEnv) (string, error) {
	dir := filepath.Join(env.tmp, "synth-scale-20000")
	path := filepath.Join(dir, "manifest.jsonl")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	cfg := synth.DefaultConfig()
	cfg.Out, cfg.Samples, cfg.Seed = dir, 20000, 1
	sum, err := synth.Generate(context.Background(), cfg)
	return sum.Path, err
}

// repeatManifest writes every line of src n times, the k-th copy's id suffixed -k.
func repeatManifest(src, dst string, n int) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(out, 1<<20)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for k := range n {
		for _, line := range lines {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				return err
			}
			m["id"] = fmt.Sprintf("%v-%d", m["id"], k)
			enc, _ := json.Marshal(m)
			w.Write(append(enc, '\n'))
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return out.Close()
}
