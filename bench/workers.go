package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"

	"github.com/mmfeed/mmfeed/pipeline/serve"
)

// benchWorkers: samples per second a planner (`serve --role planner`, in-process, with
// in-process consumers acknowledging every batch) delivers with 1 and 2 worker processes
// (`bin/mmfeed serve --role worker --slots 1`, GOMAXPROCS=1 each), on the same input as
// the serve section. On this 2-core machine the planner, the NATS server, the consumers
// and the workers share both cores, so 2 workers cannot double 1: the efficiency key says
// how far they get. The item-time keys compare the planner's predicted time of a batch
// item (from its megapixels and bytes, scaled by the measured seconds per unit) with the
// worker's measured time, with one worker. features_workers_<n>_entries_per_s is the
// feature pass (feature items: token counts and image headers) by the same workers.
func benchWorkers(env *benchEnv) (map[string]float64, error) {
	if _, err := os.Stat("bin/mmfeed"); err != nil {
		return nil, fmt.Errorf("bin/mmfeed: %w (make build)", err)
	}
	input, label, err := benchInput(env, 800)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, n := range []int{1, 2} {
		cfg := serve.DefaultConfig()
		cfg.Job = fmt.Sprintf("bench-workers-%d", n)
		cfg.Pipeline.Input = input
		cfg.Pipeline.Plan.DP, cfg.Pipeline.Plan.GlobalBatch = 2, 32
		rate, st, times, err := PlannerThroughput(context.Background(), cfg, func(url string) (func(), error) {
			return startWorkerProcs(url, n)
		})
		if err != nil {
			return nil, err
		}
		fmt.Printf("   %s corpus, %d samples, %d worker process(es) of 1 core on %d cores: %.0f samples/s\n",
			label, st.Samples, n, runtime.NumCPU(), rate)
		out[fmt.Sprintf("serve_workers_%d_samples_per_s", n)] = rate
		if times.FeatureSeconds > 0 {
			out[fmt.Sprintf("features_workers_%d_entries_per_s", n)] = float64(times.FeatureEntries) / times.FeatureSeconds
			fmt.Printf("   feature pass: %d entries in %.2fs\n", times.FeatureEntries, times.FeatureSeconds)
		}
		fmt.Printf("   item times (%d items): predicted %.1f ms, measured %.1f ms, mean abs error %.1f ms\n",
			times.Items, times.PredictedMS, times.MeasuredMS, times.AbsErrorMS)
		if n == 1 { // one worker: the item times are not stretched by a second worker on the same cores
			out["serve_workers_item_predicted_ms"] = times.PredictedMS
			out["serve_workers_item_measured_ms"] = times.MeasuredMS
			out["serve_workers_item_abs_error_ms"] = times.AbsErrorMS
		}
	}
	out["serve_workers_2_efficiency"] = out["serve_workers_2_samples_per_s"] / (2 * out["serve_workers_1_samples_per_s"])
	return out, nil
}

// startWorkerProcs starts n worker processes of one core each against url.
func startWorkerProcs(url string, n int) (func(), error) {
	var procs []*exec.Cmd
	stop := func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}
	for range n {
		cmd := exec.Command("bin/mmfeed", "serve", "--role", "worker", "--nats", url, "--slots", "1", "--log-format", "text")
		cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
		if err := cmd.Start(); err != nil {
			stop()
			return nil, err
		}
		procs = append(procs, cmd)
	}
	return stop, nil
}
