// Command scale runs the control-plane scale ladder of docs/BENCHMARKS.md
// ("Control plane at scale (issue 21)"): N simulated trainer ranks
// (internal/scalesim) against the real bin/mmfeed (a planner and workers)
// over nats-server processes, for each N of -n, plus a planner failover
// (kill -9 of the leader, a standby takes over) at -failover ranks. It
// merges its figures into -out under scale_* keys and prints a Markdown
// table.
//
//	go run ./bench/scale [-n 64,256,1024] [-failover 256] [-out bench/results.json]
//
// `make scale` runs it. On the 2-core development machine the largest N
// runs on one nats-server with fewer steps (-single-above).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mmfeed/mmfeed/internal/scalesim"
)

func main() {
	ns := flag.String("n", "64,256,1024", "rank counts of the ladder")
	failover := flag.Int("failover", 256, "ranks of the planner failover run (0: none)")
	single := flag.Int("single-above", 256, "above this many ranks: one nats-server and -big-steps steps")
	steps := flag.Int("steps", 12, "steps per epoch")
	bigSteps := flag.Int("big-steps", 6, "steps per epoch above -single-above")
	epochs := flag.Int("epochs", 2, "epochs")
	workers := flag.Int("workers", 1, "worker processes")
	strategy := flag.String("strategy", "mmfeed", "the planner's --strategy")
	bin := flag.String("bin", "bin/mmfeed", "the mmfeed binary")
	out := flag.String("out", "bench/results.json", "results file (merged with what is there)")
	keep := flag.String("dir", "", "scratch folder (default: a temporary one, removed)")
	flag.Parse()
	root, _ := os.Getwd()
	natsBin, err := scalesim.NATSBinary(root)
	if err != nil {
		log.Fatal(err)
	}
	dir := *keep
	if dir == "" {
		if dir, err = os.MkdirTemp("", "mmfeed-scale-"); err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(dir)
	}
	runs, err := ladder(*ns, *single, *steps, *bigSteps, *epochs, *failover)
	if err != nil {
		log.Fatal(err)
	}
	results := map[string]float64{}
	if b, err := os.ReadFile(*out); err == nil {
		_ = json.Unmarshal(b, &results)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("load before: %s", load)
	for i, sc := range runs {
		sc.Bin, sc.NATSBin, sc.PerRank, sc.MicroBatches, sc.Workers, sc.Strategy = *bin, natsBin, 4, 2, *workers, *strategy
		sc.Dir, sc.Log = filepath.Join(dir, fmt.Sprintf("run%d-n%d", i, sc.N)), os.Stderr
		runScenario(sc, results)
	}
	load, _ = os.ReadFile("/proc/loadavg")
	fmt.Printf("load after: %s", load)
	b, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
}

// ladder returns the scenarios of the rank counts ns (comma-separated),
// each restarting a nats-server mid second epoch, and the failover run at
// failover ranks (0: none). Above single ranks a run has one server and
// bigSteps steps.
func ladder(ns string, single, steps, bigSteps, epochs, failover int) ([]*scalesim.Scenario, error) {
	var runs []*scalesim.Scenario
	for _, s := range strings.Split(ns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("-n: %v", err)
		}
		sc := &scalesim.Scenario{N: n, Servers: 3, Steps: steps, Epochs: epochs, KillLeaderAt: -1}
		if n > single {
			sc.Servers, sc.Steps = 1, bigSteps
		}
		// Mid second epoch, leaving the steps that a rank's window (2 steps)
		// does not hide before the end.
		sc.RestartNATSAt = min(sc.Steps+sc.Steps/2, sc.Steps*sc.Epochs-4)
		runs = append(runs, sc)
	}
	if failover > 0 {
		runs = append(runs, &scalesim.Scenario{N: failover, Servers: 3, Steps: steps, Epochs: epochs, RestartNATSAt: -1, KillLeaderAt: steps / 2})
	}
	return runs, nil
}

// runScenario runs sc and merges its figures into results under its
// scale_n<N>_ (or scale_failover_n<N>_) keys; a run that failed before it
// had figures adds none.
func runScenario(sc *scalesim.Scenario, results map[string]float64) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	t0 := time.Now()
	f, err := sc.Run(ctx)
	cancel()
	if err != nil {
		log.Printf("N=%d: %v", sc.N, err)
		if f == nil {
			return
		}
	}
	prefix := fmt.Sprintf("scale_n%d_", sc.N)
	if sc.KillLeaderAt >= 0 {
		prefix = fmt.Sprintf("scale_failover_n%d_", sc.N)
	}
	m := f.Map(prefix)
	maps.Copy(results, m)
	results[prefix+"servers"] = float64(sc.Servers)
	log.Printf("N=%d done in %v", sc.N, time.Since(t0).Round(time.Second))
	printFigures(prefix, m)
}

func printFigures(prefix string, m map[string]float64) {
	fmt.Printf("\n| %s | value |\n|---|---:|\n", strings.TrimSuffix(prefix, "_"))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Printf("| %s | %.4g |\n", strings.TrimPrefix(k, prefix), m[k])
	}
}
