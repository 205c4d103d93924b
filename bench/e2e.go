package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader/synth"
	"github.com/mmfeed/mmfeed/pipeline"
)

// e2eSettings is the one training setup every strategy runs under. dp 2 (one rank per core
// of the 2-core machine), tiny model, dynamic resolution so image tokens follow the native
// size, long captions kept (max length 512) so text cost follows caption length.
type e2eSettings struct {
	DP, GlobalBatch, MicroBatches int
	// MaxPixels bounds dynamic-resolution images: the tiny model's position table is 32×32
	// patches, so the longest side must stay ≤ 512 px for the corpus' most elongated image
	// (4:1 generated, 8:1 real: 61,440 and 32,768 pixels).
	MaxPixels, MaxLength int
	// Steps is the number of steps trained (the whole epoch of the corpus, so that every
	// strategy trains on the same samples); Warmup of them are left out of the numbers.
	Steps, Warmup int
	// Rounds: each strategy runs this many times, interleaved with the others.
	Rounds int
}

func defaultE2ESettings() e2eSettings {
	return e2eSettings{DP: 2, GlobalBatch: 64, MicroBatches: 8, MaxPixels: 61440, MaxLength: 512,
		Steps: 25, Warmup: 3, Rounds: 2}
}

// e2eCase is one corpus: its manifest and its label in result keys.
type e2eCase struct {
	label, title, manifest string
	maxPixels              int
}

// e2eVariant is one trained configuration: a strategy, with padded or packed (--pack)
// micro-batches.
type e2eVariant struct {
	strategy balancer.Strategy
	pack     bool
}

// String is the strategy's name, with "_packed" for packed micro-batches.
func (v e2eVariant) String() string {
	if v.pack {
		return v.strategy.String() + "_packed"
	}
	return v.strategy.String()
}

// e2eStrategies: the three strategies padded, and mmfeed packed (the trainer runs --pack).
var e2eStrategies = []e2eVariant{{balancer.StrategyMmfeed, false}, {balancer.StrategyRandom, false},
	{balancer.StrategyLengthGrouped, false}, {balancer.StrategyMmfeed, true}}

// benchE2E trains the bundled tiny model for the same steps on the same corpus under each
// strategy, from `mmfeed shard` files (preprocessing done before, so it does not compete
// for the cores), dp ranks pinned to separate cores, and compares measured step times.
//
// MMFEED_E2E_PARTS selects parts: "steps" (the strategy comparison), "calib" (the
// calibration loop); default both. MMFEED_E2E_CASES selects corpora by label
// ("skewed,real"); default all.
func benchE2E(env *benchEnv) (map[string]float64, error) {
	st := defaultE2ESettings()
	cases, err := e2eCases(env, st)
	if err != nil {
		return nil, err
	}
	parts := os.Getenv("MMFEED_E2E_PARTS")
	out := map[string]float64{}
	var groups []balancer.StepTimeGroup
	runs, err := runE2ECases(env, selectE2ECases(cases, parts, os.Getenv("MMFEED_E2E_CASES")), st)
	if err != nil {
		return nil, err
	}
	for _, run := range runs {
		c := run.c
		res, err := run.results()
		if err != nil {
			return nil, fmt.Errorf("e2e %s: %w", c.label, err)
		}
		printE2ETable(c, res)
		g := balancer.StepTimeGroup{Title: c.title}
		for _, s := range e2eStrategies {
			g.Runs = append(g.Runs, e2eStrategyFigures(out, c, s, res[s.String()]))
		}
		e2eRatios(out, c, res)
		groups = append(groups, g)
	}
	if parts == "" || strings.Contains(parts, "calib") {
		cal, err := benchE2ECalibration(env, st)
		if err != nil {
			return nil, fmt.Errorf("e2e calibration: %w", err)
		}
		maps.Copy(out, cal)
	}
	if len(groups) > 0 {
		if err := writeE2EPage(groups); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// selectE2ECases returns the cases to run for the strategy comparison:
// none unless parts is empty or names "steps"; those whose label only
// lists (comma-separated), or all when only is empty.
func selectE2ECases(cases []e2eCase, parts, only string) []e2eCase {
	var selected []e2eCase
	for _, c := range cases {
		if (parts == "" || strings.Contains(parts, "steps")) && (only == "" || slices.Contains(strings.Split(only, ","), c.label)) {
			selected = append(selected, c)
		}
	}
	return selected
}

// e2eStrategyFigures adds case c's figures of strategy s (result r) to out
// and returns its runs for the step-time page.
func e2eStrategyFigures(out map[string]float64, c e2eCase, s e2eVariant, r e2eResult) balancer.StepTimes {
	k := fmt.Sprintf("e2e_%s_%s_", c.label, s)
	out[k+"step_ms_mean"] = 1e3 * r.StepMean
	out[k+"step_ms_p50"] = 1e3 * r.StepP50
	out[k+"step_ms_p99"] = 1e3 * r.StepP99
	out[k+"idle_ms_mean"] = 1e3 * r.IdleMean
	out[k+"sync_ms_mean"] = 1e3 * r.SyncMean
	out[k+"data_wait_fraction"] = r.DataWaitFraction
	out[k+"padding_eff"] = r.PaddingEff
	out[k+"imb_predicted"] = r.ImbPredicted
	out[k+"imb_measured"] = r.ImbMeasured
	if r.ImbPredicted > 0 {
		// The plan's predicted imbalance is the FLOP prior's.
		out[k+"imb_measured_over_predicted"] = r.ImbMeasured / r.ImbPredicted
	}
	if r.ImbCalibratedRatio > 0 {
		// After calibration (calibratedImbalance: refit on the other round's rank-steps).
		out[k+"imb_measured_over_calibrated"] = r.ImbCalibratedRatio
		out[k+"calib_fit_mean_rel_err"] = r.CalibFitErr
	}
	return balancer.StepTimes{Strategy: s.String(), Seconds: r.StepSeconds,
		IdleFraction: r.IdleFraction, ImbalancePredicted: r.ImbPredicted, ImbalanceMeasured: r.ImbMeasured}
}

// e2eRatios adds case c's step-time ratios of random over mmfeed (padded
// and packed) to out and prints them.
func e2eRatios(out map[string]float64, c e2eCase, res map[string]e2eResult) {
	mm, rnd := res[balancer.StrategyMmfeed.String()], res[balancer.StrategyRandom.String()]
	if packed := res[e2eVariant{balancer.StrategyMmfeed, true}.String()]; packed.StepMean > 0 {
		ratio := rnd.StepMean / packed.StepMean
		out["e2e_step_time_random_over_mmfeed_packed_"+c.label] = ratio
		if packed.ImbPredicted > 0 {
			out["e2e_packed_"+c.label+"_imb_measured_over_prior"] = packed.ImbMeasured / packed.ImbPredicted
		}
		if packed.ImbCalibratedRatio > 0 {
			// The key: measured over predicted imbalance after calibration.
			out["e2e_packed_"+c.label+"_imb_measured_over_predicted"] = packed.ImbCalibratedRatio
			fmt.Printf("   packed (%s): measured / predicted imbalance after calibration %.4f (fit error %.1f%%), FLOP prior %.4f\n",
				c.label, packed.ImbCalibratedRatio, 100*packed.CalibFitErr, packed.ImbMeasured/packed.ImbPredicted)
		}
		fmt.Printf("   step time random (padded) / mmfeed packed (%s): mean %.3f×\n", c.label, ratio)
	}
	if mm.StepMean > 0 {
		ratio := rnd.StepMean / mm.StepMean
		out["e2e_step_time_random_over_mmfeed_"+c.label] = ratio
		out["e2e_step_time_random_over_mmfeed_"+c.label+"_median"] = rnd.StepP50 / mm.StepP50
		out["e2e_compute_random_over_mmfeed_"+c.label] = rnd.ComputeMean / mm.ComputeMean
		fmt.Printf("   step time random / mmfeed (%s): mean %.3f×, median %.3f×; rank compute %.3f×\n",
			c.label, ratio, rnd.StepP50/mm.StepP50, rnd.ComputeMean/mm.ComputeMean)
	}
}

// e2eCases: a generated corpus with strong skew, one without skew, and the real corpus
// (its first samples) when MMFEED_CORPUS is set. Each has exactly Steps global batches.
func e2eCases(env *benchEnv, st e2eSettings) ([]e2eCase, error) {
	n := st.Steps * st.GlobalBatch
	var cases []e2eCase
	for _, skew := range []string{"strong", "none"} {
		cfg := synth.DefaultConfig()
		cfg.Out, cfg.Samples, cfg.Seed, cfg.Skew = filepath.Join(env.tmp, "e2e-"+skew), n, 1, skew
		sum, err := synth.Generate(context.Background(), cfg)
		if err != nil {
			return nil, err
		}
		label := map[string]string{"strong": "skewed", "none": "unskewed"}[skew]
		cases = append(cases, e2eCase{label, fmt.Sprintf("generated, --skew %s, %d samples", skew, n), sum.Path, st.MaxPixels})
	}
	if env.corpus != "" {
		m := filepath.Join(env.tmp, "e2e-real.jsonl")
		if err := writeManifestHead(filepath.Join(env.corpus, "dev", "manifest.jsonl"), m, n); err != nil {
			return nil, err
		}
		cases = append(cases, e2eCase{"real", fmt.Sprintf("real corpus (first %d samples of dev)", n), m, 32768})
	}
	return cases, nil
}

// e2eRun is one case's shard sets (one per strategy) and, round by round, its training logs.
type e2eRun struct {
	c       e2eCase
	dirs    map[string]string
	reports map[string]balancer.Summary
	feats   map[string]e2ePlanFeatures
	rounds  map[string][][]e2eRow // per strategy, per round (warm-up dropped)
}

// prepareE2ECase writes one shard set per strategy.
func prepareE2ECase(env *benchEnv, c e2eCase, st e2eSettings) (*e2eRun, error) {
	run := &e2eRun{c: c, dirs: map[string]string{}, reports: map[string]balancer.Summary{},
		feats: map[string]e2ePlanFeatures{}, rounds: map[string][][]e2eRow{}}
	for _, s := range e2eStrategies {
		dir := filepath.Join(env.tmp, "e2e-shards-"+c.label+"-"+s.String())
		cst := st
		cst.MaxPixels = c.maxPixels
		rep, pf, err := writeE2EShards(c.manifest, dir, s, cst)
		if err != nil {
			return nil, err
		}
		run.dirs[s.String()], run.reports[s.String()], run.feats[s.String()] = dir, rep.Strategies[s.strategy.String()], pf
	}
	return run, nil
}

// trainRound trains every strategy once, forward in even rounds and backwards in odd ones,
// so drift over the run hits every strategy alike.
func (run *e2eRun) trainRound(env *benchEnv, st e2eSettings, round int) error {
	order := slices.Clone(e2eStrategies)
	if round%2 == 1 {
		slices.Reverse(order)
	}
	for _, s := range order {
		logDir := filepath.Join(env.tmp, fmt.Sprintf("e2e-log-%s-%s-%d", run.c.label, s, round))
		var extra []string
		if s.pack {
			extra = append(extra, "--pack")
		}
		steps, err := trainE2E(env, "--shards", run.dirs[s.String()], logDir, st, extra...)
		if err != nil {
			return fmt.Errorf("%s round %d: %w", s, round, err)
		}
		run.rounds[s.String()] = append(run.rounds[s.String()], dropWarmup(steps, st.Warmup))
	}
	return nil
}

// results summarises every strategy's rounds.
func (run *e2eRun) results() (map[string]e2eResult, error) {
	prior, err := balancer.NewCostModel(balancer.TinyShape())
	if err != nil {
		return nil, err
	}
	out := map[string]e2eResult{}
	for name, rounds := range run.rounds {
		r := summarizeE2E(slices.Concat(rounds...))
		r.PaddingEff, r.ImbPredicted = run.reports[name].PaddingEfficiency, run.reports[name].ImbalanceMean
		if r.ImbCalibratedRatio, r.CalibFitErr, err = calibratedImbalance(prior, run.feats[name], rounds); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = r
	}
	return out, nil
}

// runE2ECases trains the cases' rounds interleaved (round 0 of every case, then round 1),
// so that a case and its control (skewed and unskewed) see the same state of the machine:
// the unskewed excess over prediction is the timing noise the skewed one is compared with.
func runE2ECases(env *benchEnv, cases []e2eCase, st e2eSettings) ([]*e2eRun, error) {
	var runs []*e2eRun
	for _, c := range cases {
		run, err := prepareE2ECase(env, c, st)
		if err != nil {
			return nil, fmt.Errorf("e2e %s: %w", c.label, err)
		}
		runs = append(runs, run)
	}
	syscall.Sync() // write the shards back now, not while the first strategy trains
	for round := range st.Rounds {
		for _, run := range runs {
			if err := run.trainRound(env, st, round); err != nil {
				return nil, fmt.Errorf("e2e %s: %w", run.c.label, err)
			}
		}
	}
	return runs, nil
}

// e2eConfig is the pipeline configuration of a case (what `mmfeed shard` builds from flags).
func e2eConfig(manifest string, s e2eVariant, st e2eSettings) (pipeline.Config, error) {
	cfg := pipeline.DefaultConfig()
	cfg.Input = manifest
	cfg.Loader.AllowAbsolute = true // the real-corpus subset names its images by absolute path
	cfg.Plan.DP, cfg.Plan.GlobalBatch, cfg.Plan.MicroBatches = st.DP, st.GlobalBatch, st.MicroBatches
	cfg.Plan.Strategy, cfg.Plan.Seed, cfg.Plan.Pack = s.strategy, 1, s.pack
	model, err := balancer.NewCostModel(balancer.TinyShape())
	if err != nil {
		return cfg, err
	}
	cfg.Plan.Model = model
	cfg.Image.Policy, cfg.Image.MaxPixels, cfg.Image.DType = "dynamic", st.MaxPixels, "uint8"
	cfg.Image.PatchSize = balancer.TinyShape().PatchSize
	cfg.Tokenizer.MaxLength = st.MaxLength
	return cfg, cfg.Validate()
}

// writeE2EShards writes the shards of one variant and returns the plan's report and its
// rank features (for calibratedImbalance).
func writeE2EShards(manifest, dir string, s e2eVariant, st e2eSettings) (*balancer.Report, e2ePlanFeatures, error) {
	cfg, err := e2eConfig(manifest, s, st)
	if err != nil {
		return nil, nil, err
	}
	prep, err := pipeline.Prepare(context.Background(), cfg, io.Discard)
	if err != nil {
		return nil, nil, err
	}
	defer prep.Close()
	plan, err := prep.Plan(s.strategy)
	if err != nil {
		return nil, nil, err
	}
	if _, err := pipeline.WriteShards(context.Background(), prep, plan, dir, nil); err != nil {
		return nil, nil, err
	}
	rep, err := prep.Report()
	return rep, planFeatures(plan), err
}

// trainE2E runs the trainer (torchrun, dp ranks, scripts/e2e_rank.py pinning each rank to
// its own core) on one data source and returns the ranks' per-step records.
func trainE2E(env *benchEnv, srcFlag, src, logDir string, st e2eSettings, extra ...string) ([]e2eRow, error) {
	root, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	args := []string{"-m", "torch.distributed.run", "--standalone", "--nproc-per-node", fmt.Sprint(st.DP),
		filepath.Join(root, "scripts", "e2e_rank.py"), srcFlag, src, "--dp", fmt.Sprint(st.DP), "--mp", "1",
		"--model", "tiny", "--steps", fmt.Sprint(st.Steps), "--log-every", "1000"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.python, append(args, extra...)...)
	cmd.Env = append(os.Environ(), "MMFEED_E2E_LOG="+logDir, "OMP_NUM_THREADS=1",
		"PYTHONPATH="+filepath.Join(root, "trainer")+prefixPath(os.Getenv("PYTHONPATH")))
	var buf strings.Builder
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("trainer: %w\n%s", err, trainerError(buf.String()))
	}
	return readRankLogs(logDir, st.DP)
}

func prefixPath(p string) string {
	if p == "" {
		return ""
	}
	return string(os.PathListSeparator) + p
}

// trainerError picks the trainer's own error lines out of torchrun's output.
func trainerError(out string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "mmfeed_trainer:") || strings.Contains(l, "Error:") {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 && len(out) > 2000 {
		return out[len(out)-2000:]
	}
	if len(lines) == 0 {
		return out
	}
	return strings.Join(lines[:min(len(lines), 10)], "\n")
}

func printE2ETable(c e2eCase, res map[string]e2eResult) {
	fmt.Printf("   %s\n", c.title)
	fmt.Printf("   %-15s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "strategy", "step ms", "p50 ms", "p99 ms", "compute", "idle ms",
		"sync ms", "wait %", "pad eff", "imb pred", "imb meas")
	for _, s := range e2eStrategies {
		r := res[s.String()]
		fmt.Printf("   %-15s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.2f %9.3f %9.3f %9.3f\n", s, 1e3*r.StepMean, 1e3*r.StepP50, 1e3*r.StepP99,
			1e3*r.ComputeMean, 1e3*r.IdleMean, 1e3*r.SyncMean, 100*r.DataWaitFraction, r.PaddingEff, r.ImbPredicted, r.ImbMeasured)
	}
}

// writeE2EPage writes the step-time comparison page next to the results.
func writeE2EPage(groups []balancer.StepTimeGroup) error {
	f, err := os.Create(filepath.Join("bench", "e2e.html"))
	if err != nil {
		return err
	}
	if err := balancer.WriteStepTimesHTML(f, "mmfeed end to end: measured step times per strategy (dp 2, tiny model, CPU)", groups); err != nil {
		f.Close()
		return err
	}
	fmt.Println("   wrote bench/e2e.html")
	return f.Close()
}
