package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/tokenize"
)

func init() {
	commands["inspect"] = command{"show what one rank received in one step: a contact sheet (PNG or HTML)", runInspect}
}

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	shards := fs.String("shards", "", "folder written by `mmfeed shard` (required)")
	rank := fs.Int("rank", 0, "dp rank")
	step := fs.Int("step", 0, "step")
	out := fs.String("out", "", "file to write (required): the contact sheet")
	format := fs.String("format", "png", "png or html")
	tok := fs.String("tokenizer", "", "tokenizer.json the shards were tokenized with (default: bert-base-uncased from the build)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if *shards == "" || *out == "" || (*format != "png" && *format != "html") || *rank < 0 || *step < 0 {
		fmt.Fprintln(stderr, "inspect: --shards and --out are required; --format is png or html; --rank and --step ≥ 0")
		return errUsage
	}
	tc := tokenize.DefaultConfig()
	tc.Path = *tok
	tk, err := tokenize.Open(tc)
	if err != nil {
		return err
	}
	defer tk.Close()
	samples, err := pipeline.ReadRankStep(filepath.Join(*shards, pipeline.RankFile(*rank)), *step, tk)
	if err != nil {
		return err
	}
	real := 0
	for _, s := range samples {
		if s.Weight > 0 {
			real++
		}
	}
	title := fmt.Sprintf("%s: rank %d, step %d: %d samples (%d padding)", filepath.Base(filepath.Clean(*shards)), *rank, *step, len(samples), len(samples)-real)
	write := func(w io.Writer) error { return pipeline.WriteContactSheetPNG(w, samples, title) }
	if *format == "html" {
		write = func(w io.Writer) error { return pipeline.WriteContactSheetHTML(w, samples, title) }
	}
	if err := pipeline.WriteFile(*out, write); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: wrote %s\n", title, *out)
	return ctx.Err()
}
