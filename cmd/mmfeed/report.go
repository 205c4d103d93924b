package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/mmfeed/mmfeed/balancer"

	"github.com/mmfeed/mmfeed/pipeline"
)

func init() {
	commands["report"] = command{"plan from cheap features and compare mmfeed with the baselines", runReport}
}

func runReport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	jf := bindJobFlags(fs)
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	quarantine := fs.String("quarantine", "", "write quarantined samples to this JSONL file")
	htmlOut := fs.String("html", "", "also write the HTML report page to this file")
	fcache := bindFeatureCache(fs)
	simulate := fs.String("simulate-ranks", "", "also estimate the random/mmfeed step-time ratio at these dp sizes, e.g. 64,256,1024 (same samples per rank)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	cfg, err := jf.config()
	if err != nil {
		return err
	}
	cfg.Progress = progressBar(stderr, "features", "samples")
	cfg.FeatureCache = featureCache(*fcache)
	qw := io.Discard
	if *quarantine != "" {
		f, err := os.Create(*quarantine)
		if err != nil {
			return err
		}
		defer f.Close()
		qw = f
	}
	prep, err := pipeline.Prepare(ctx, cfg, qw)
	if err != nil {
		return err
	}
	defer prep.Close()
	logFeatureCache(stderr, prep)
	warnTruncation(stderr, prep)
	rep, err := prep.Report()
	if err != nil {
		return err
	}
	if *htmlOut != "" {
		if err := writeReportHTML(ctx, *htmlOut, prep, rep); err != nil {
			return err
		}
	}
	sims, err := simulateRanks(*simulate, prep, cfg.Plan)
	if err != nil {
		return err
	}
	mix, err := mixtureReport(prep)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeReportJSON(stdout, rep, mix, sims)
	}
	return writeReportText(stdout, cfg, prep, rep, mix, sims)
}

// simulateRanks estimates the random/mmfeed step-time ratio at the dp sizes
// of spec (--simulate-ranks; "": none), with the job's samples per rank.
func simulateRanks(spec string, prep *pipeline.Prepared, plan balancer.Config) ([]balancer.SimResult, error) {
	if spec == "" {
		return nil, nil
	}
	ranks, err := parseInts(spec)
	if err != nil {
		return nil, fmt.Errorf("--simulate-ranks: %w", err)
	}
	perRank := max(1, plan.GlobalBatch/plan.DP)
	return balancer.Simulate(prep.Features.Items, plan, balancer.SimulateConfig{Ranks: ranks, PerRank: perRank, Seed: plan.Seed})
}

// writeReportJSON prints report --json: the report, with the mixture's and
// the simulation's sections when there are any.
func writeReportJSON(stdout io.Writer, rep *balancer.Report, mix *pipeline.MixtureReport, sims []balancer.SimResult) error {
	if sims == nil && mix == nil {
		return rep.WriteJSON(stdout)
	}
	return writeJSON(stdout, struct {
		*balancer.Report
		Mixture    *pipeline.MixtureReport `json:"mixture,omitempty"`
		Simulation []balancer.SimResult    `json:"simulation,omitempty"`
	}{rep, mix, sims})
}

// writeReportText prints report's table, then the mixture's and the
// simulation's sections when there are any.
func writeReportText(stdout io.Writer, cfg pipeline.Config, prep *pipeline.Prepared, rep *balancer.Report, mix *pipeline.MixtureReport, sims []balancer.SimResult) error {
	fmt.Fprintf(stdout, "%s: %d samples seen, %d quarantined\n", cfg.InputName(), prep.Seen(), rep.Quarantined)
	if l := pipeline.KeptLine(rep.Kept); l != "" {
		fmt.Fprintln(stdout, l)
	}
	if tt := rep.TextTruncation; tt != nil {
		fmt.Fprintf(stdout, "captions truncated at --max-length %d: %d of %d (%.1f%%)\n", tt.MaxLength, tt.AtMaxLength, tt.Captions, 100*tt.Share)
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if mix != nil {
		fmt.Fprintln(stdout)
		if err := mix.WriteText(stdout); err != nil {
			return err
		}
	}
	if sims != nil {
		fmt.Fprintf(stdout, "\nsimulated at scale (%d samples per rank, bootstrap of this corpus, ranks meet at every %s):\n", max(1, cfg.Plan.GlobalBatch/cfg.Plan.DP), cfg.Plan.Sync)
		fmt.Fprintf(stdout, "  %8s  %22s  %22s  %16s\n", "dp ranks", "random imb p50/p99", "mmfeed imb p50/p99", "random/mmfeed")
		for _, r := range sims {
			fmt.Fprintf(stdout, "  %8d  %10.3f / %-9.3f  %10.3f / %-9.3f  %15.3fx\n", r.Ranks,
				r.RandomImbalanceP50, r.RandomImbalanceP99, r.MmfeedImbalanceP50, r.MmfeedImbalanceP99, r.StepTimeRandomOverMmfeed)
		}
	}
	return nil
}

// mixtureReport is the per-source report of a mixture's plan (nil for a
// plain input).
func mixtureReport(prep *pipeline.Prepared) (*pipeline.MixtureReport, error) {
	if prep.Config.Mixture == nil {
		return nil, nil
	}
	plan, err := prep.Plan(prep.Config.Plan.Strategy)
	if err != nil {
		return nil, err
	}
	return prep.MixtureReport(plan), nil
}

// reportThumbnails is how many heaviest and how many extreme-aspect samples a
// report page shows.
const reportThumbnails = 6

// writeReportHTML writes the report page, with thumbnails and a mixture's
// per-source section, to path.
func writeReportHTML(ctx context.Context, path string, prep *pipeline.Prepared, rep *balancer.Report) error {
	plan, err := prep.Plan(prep.Config.Plan.Strategy)
	if err != nil {
		return err
	}
	if rep.Thumbnails, err = pipeline.Thumbnails(ctx, prep, plan, reportThumbnails); err != nil {
		return err
	}
	mix := prep.MixtureReport(plan) // nil for a plain input
	return pipeline.WriteFile(path, func(w io.Writer) error { return pipeline.WriteReportHTML(w, rep, mix) })
}

// warnTruncation warns on stderr when more than 1% of the captions were
// truncated at --max-length (pipeline.TruncationWarning).
func warnTruncation(stderr io.Writer, prep *pipeline.Prepared) {
	if w := pipeline.TruncationWarning(prep.TextTruncation()); w != "" {
		fmt.Fprintln(stderr, "warning: "+w)
	}
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
