package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/tokenize"
)

func init() {
	commands["inspect"] = command{"show what one rank received in one step: a contact sheet (PNG or HTML)", runInspect}
}

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	shards := fs.String("shards", "", "folder written by mmfeed shard (or --nats and --job)")
	natsURL := fs.String("nats", "", "NATS URL of a running service: ask it for the step (core data plane) or read the job's stream (jetstream), without taking it")
	job := fs.String("job", "", "job name (with --nats)")
	epoch := fs.Int("epoch", 0, "epoch (with --nats)")
	rank := fs.Int("rank", 0, "dp rank")
	step := fs.Int("step", 0, "step")
	out := fs.String("out", "", "file to write (required): the contact sheet")
	format := fs.String("format", "png", "png or html")
	var auth natsenv.Config
	fs.StringVar(&auth.User, "nats-user", "", "NATS user (with --nats-password; a secured service: its viewer user from mmfeed creds, docs/security.md)")
	fs.StringVar(&auth.Password, "nats-password", "", "NATS password (default $MMFEED_NATS_PASSWORD)")
	fs.StringVar(&auth.TLSCA, "nats-tls-ca", "", "CA certificate of the NATS server")
	tok := fs.String("tokenizer", "", "tokenizer.json the shards were tokenized with (default: bert-base-uncased from the build)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if (*shards == "") == (*natsURL == "") || (*natsURL != "" && *job == "") || *out == "" || (*format != "png" && *format != "html") || *rank < 0 || *step < 0 {
		fmt.Fprintln(stderr, "inspect: --out and either --shards or --nats with --job are required; --format is png or html; --rank and --step ≥ 0")
		return errUsage
	}
	tc := tokenize.DefaultConfig()
	tc.Path = *tok
	tk, err := tokenize.Open(tc)
	if err != nil {
		return err
	}
	defer tk.Close()
	var samples []pipeline.SheetSample
	source := filepath.Base(filepath.Clean(*shards))
	if *natsURL != "" {
		source = "job " + *job
		var opts []nats.Option
		if opts, err = natsenv.ClientOptions(auth); err != nil {
			return err
		}
		samples, err = streamStep(ctx, *natsURL, *job, *epoch, *step, *rank, tk, opts...)
	} else {
		samples, err = pipeline.ReadRankStep(filepath.Join(*shards, pipeline.RankFile(*rank)), *step, tk)
	}
	if err != nil {
		return err
	}
	real := 0
	for _, s := range samples {
		if s.Weight > 0 {
			real++
		}
	}
	title := fmt.Sprintf("%s: rank %d, step %d: %d samples (%d padding)", source, *rank, *step, len(samples), len(samples)-real)
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

// streamStep reads one rank's step from a running job without taking it:
// viewer fetches on the core data plane (pipeline.ReadServiceStep), and the
// job's stream when no service answers them (a --data-plane jetstream job,
// pipeline.ReadStreamStep).
func streamStep(ctx context.Context, url, job string, epoch, step, rank int, tk *tokenize.Tokenizer, opts ...nats.Option) ([]pipeline.SheetSample, error) {
	nc, err := nats.Connect(url, append([]nats.Option{nats.Name("mmfeed inspect"), nats.Timeout(10 * time.Second),
		nats.CustomInboxPrefix(natsenv.ViewerInboxPrefix)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("nats %s: %w", url, err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	samples, err := pipeline.ReadServiceStep(ctx, nc, job, epoch, step, rank, tk)
	if !errors.Is(err, pipeline.ErrNotCore) {
		return samples, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return pipeline.ReadStreamStep(ctx, js, job, epoch, step, rank, tk)
}
