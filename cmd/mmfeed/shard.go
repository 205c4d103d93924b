package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/proto"
)

func init() {
	commands["shard"] = command{"preprocess a dataset into balanced per-rank Arrow IPC files", runShard}
}

func runShard(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("shard", flag.ContinueOnError)
	jf := bindJobFlags(fs)
	out := fs.String("out", "", "output folder or URL: s3://bucket/prefix, gs://, az://, file:///path (required)")
	o := pipeline.DefaultShardOptions()
	fs.StringVar(&o.Store, "store", o.Store, "tensor (the preprocessed tensor in --dtype) or jpeg (the resized image re-encoded; implies --dtype uint8)")
	fs.IntVar(&o.JPEGQuality, "jpeg-quality", o.JPEGQuality, "JPEG quality of --store jpeg, 1..100")
	fs.StringVar(&o.Compression, "compression", o.Compression, "Arrow IPC buffer compression: zstd, lz4 or none")
	fs.IntVar(&o.Epochs, "epochs", o.Epochs, "epochs to plan from --epoch on; samples are written once, each epoch adds an index")
	inputCache := fs.String("input-cache", defaultInputCache(), "where an --input URL (s3://, gs://, az://) that is not WebDataset shards is copied before indexing (shards, also https://, are streamed)")
	fs.IntVar(&o.PartSteps, "part-steps", o.PartSteps, "start new rank files every K steps, so a crashed run redoes at most K steps (0: one file per rank)")
	fcache := bindFeatureCache(fs)
	nf := bindShardNATSFlags(fs)
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if *out == "" {
		fmt.Fprintln(stderr, "shard: --out is required")
		return errUsage
	}
	if o.Store == pipeline.StoreJPEG {
		if set(fs, "dtype") && jf.cfg.Image.DType != proto.DTypeUint8 {
			return fmt.Errorf("--store jpeg keeps uint8 pixels; drop --dtype %s", jf.cfg.Image.DType)
		}
		jf.cfg.Image.DType = proto.DTypeUint8
	}
	cfg, err := jf.config()
	if err != nil {
		return err
	}
	cfg.Progress = progressBar(stderr, "features", "samples")
	cfg.FeatureCache = featureCache(*fcache)
	cfg.InputCache = *inputCache // a mixture's URL sources are staged there too
	if err := nf.checkInput(&cfg); err != nil {
		return err
	}
	res, err := pipeline.RunShard(ctx, pipeline.ShardJob{Config: cfg, Out: *out, Options: o, InputCache: *inputCache, Thumbnails: reportThumbnails,
		Staged:   func(input, path string) { fmt.Fprintf(stderr, "staged %s in %s\n", input, path) },
		Prepared: func(prep *pipeline.Prepared) { logFeatureCache(stderr, prep); warnTruncation(stderr, prep) },
		Source: func(ctx context.Context, prep *pipeline.Prepared) (pipeline.StepSource, func(), error) {
			return nf.source(ctx, prep, stderr)
		},
		Progress: progressBar(stderr, "preprocessing", "steps")})
	if err != nil {
		return err
	}
	sum, rep := res.Summary, res.Report
	el := res.Elapsed.Seconds()
	fmt.Fprintln(stdout, shardLine(res.Input, res.Seen, sum.Planned(res.Plan), len(sum.Failed), rep))
	if l := pipeline.KeptLine(rep.Kept); l != "" {
		fmt.Fprintln(stdout, l)
	}
	fmt.Fprintf(stdout, "wrote %d data files (%d record batches, %d rows, %.1f MB, %s, %s) and %d epoch indexes to %s in %.1fs (%.0f samples/s)\n",
		len(sum.Files), sum.Batches, sum.Rows, float64(sum.Bytes)/1e6, storeLabel(o, cfg.Image.DType), o.Compression,
		len(sum.Epochs), *out, el, float64(sum.Rows)/el)
	if sum.Reused > 0 {
		fmt.Fprintf(stdout, "resumed: kept %d verified data files of the interrupted run\n", sum.Reused)
	}
	return rep.WriteTable(stdout)
}

// shardLine is the summary's first line. A sample that failed to decode after it was
// planned counts once, as quarantined (planned + quarantined + dropped = seen).
func shardLine(input string, seen int64, planned, failed int, rep *balancer.Report) string {
	q := ""
	if failed > 0 {
		q = fmt.Sprintf(" (%d of them failed to decode after planning, stored at weight 0)", failed)
	}
	return fmt.Sprintf("%s: %d samples seen, %d planned in %d steps × %d ranks × %d micro-batches, %d quarantined%s, %d dropped at the tail",
		input, seen, planned, rep.Steps, rep.DP, rep.MicroBatches, rep.Quarantined, q, rep.Dropped)
}

// defaultInputCache is ~/.cache/mmfeed (the OS cache folder), or the temp folder.
func defaultInputCache() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "mmfeed")
	}
	return os.TempDir()
}

func storeLabel(o pipeline.ShardOptions, dtype string) string {
	if o.Store == pipeline.StoreJPEG {
		return fmt.Sprintf("jpeg q%d", o.JPEGQuality)
	}
	return "tensor " + dtype
}

// set reports whether the flag name was given on the command line.
func set(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
}
