package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline"
)

func init() {
	commands["shard"] = command{"preprocess a dataset into balanced per-rank Arrow IPC files", runShard}
}

func runShard(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("shard", flag.ContinueOnError)
	jf := bindJobFlags(fs)
	out := fs.String("out", "", "output folder (required)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if *out == "" {
		fmt.Fprintln(stderr, "shard: --out is required")
		return errUsage
	}
	cfg, err := jf.config()
	if err != nil {
		return err
	}
	cfg.Progress = progressBar(stderr, "features", "samples")
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	qf, err := os.Create(filepath.Join(*out, "quarantine.jsonl"))
	if err != nil {
		return err
	}
	defer qf.Close()
	start := time.Now()
	prep, err := pipeline.Prepare(ctx, cfg, qf)
	if err != nil {
		return err
	}
	defer prep.Close()
	plan, err := prep.Plan(cfg.Plan.Strategy)
	if err != nil {
		return err
	}
	if err := pipeline.WriteFile(filepath.Join(*out, "plan.jsonl"), plan.WriteJSONL); err != nil {
		return err
	}
	sum, err := pipeline.WriteShards(ctx, prep, plan, *out, progressBar(stderr, "preprocessing", "steps"))
	if err != nil {
		return err
	}
	// The report is written last so that its quarantine count includes decode failures.
	rep, err := prep.Report()
	if err != nil {
		return err
	}
	if rep.Thumbnails, err = pipeline.Thumbnails(ctx, prep, plan, reportThumbnails); err != nil {
		return err
	}
	if err := pipeline.WriteFile(filepath.Join(*out, "report.json"), rep.WriteJSON); err != nil {
		return err
	}
	if err := pipeline.WriteFile(filepath.Join(*out, "report.html"), func(w io.Writer) error { return balancer.WriteHTML(w, rep) }); err != nil {
		return err
	}
	el := time.Since(start).Seconds()
	fmt.Fprintf(stdout, "%s: %d samples seen, %d planned in %d steps × %d ranks × %d micro-batches, %d quarantined, %d dropped at the tail\n",
		cfg.Input, prep.Seen(), rep.Samples, rep.Steps, rep.DP, rep.MicroBatches, rep.Quarantined, rep.Dropped)
	fmt.Fprintf(stdout, "wrote %d rank files (%d record batches, %.1f MB) to %s in %.1fs (%.0f samples/s)\n",
		len(sum.Files), sum.Batches, float64(sum.Bytes)/1e6, *out, el, float64(sum.Rows)/el)
	return rep.WriteTable(stdout)
}
