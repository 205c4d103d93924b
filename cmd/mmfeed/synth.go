package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/mmfeed/mmfeed/loader/synth"
)

func init() {
	commands["synth"] = command{"generate a skewed image–caption corpus", runSynth}
}

func runSynth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := synth.DefaultConfig()
	fs := flag.NewFlagSet("synth", flag.ContinueOnError)
	fs.StringVar(&cfg.Out, "out", "", "output folder (required)")
	fs.IntVar(&cfg.Samples, "samples", cfg.Samples, "number of samples")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed (same seed, same corpus)")
	fs.StringVar(&cfg.Format, "format", cfg.Format, "jsonl (images/ + manifest.jsonl) or wds (WebDataset .tar shards)")
	fs.StringVar(&cfg.Skew, "skew", cfg.Skew, "strong (long-tailed captions, varied image sizes) or none")
	fs.Float64Var(&cfg.BadFraction, "bad-fraction", cfg.BadFraction, "share of deliberately broken samples, for quarantine tests")
	asJSON := fs.Bool("json", false, "print the summary as JSON")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if cfg.Out == "" {
		fmt.Fprintln(stderr, "synth: --out is required")
		return errUsage
	}
	start := time.Now()
	cfg.Progress = progressBar(stderr, "synth", "samples")
	sum, err := synth.Generate(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(sum)
	}
	fmt.Fprintf(stdout, "wrote %d samples (%d JPEG, %d PNG, %d deliberately bad) to %s in %.1fs\n",
		sum.Samples, sum.JPEG, sum.PNG, len(sum.Bad), sum.Path, time.Since(start).Seconds())
	fmt.Fprintf(stdout, "captions: %.1f words on average, longest %d; largest image %d pixels\n",
		float64(sum.Words)/float64(max(1, sum.Samples)), sum.MaxWords, sum.MaxPixels)
	return nil
}
