package pipeline

import (
	"bytes"
	"context"
	"io"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
)

// ShardJob is one `mmfeed shard` run: the job's config, where the set goes,
// how it is stored, and the command's hooks.
type ShardJob struct {
	Config Config
	// Out is the output folder or URL (OpenStore).
	Out     string
	Options ShardOptions
	// InputCache is where an input URL that is not streamed is staged
	// (InputCacheDir of it).
	InputCache string
	// Thumbnails is how many heaviest and extreme-aspect samples the report
	// page shows.
	Thumbnails int
	// Staged, when not nil, is called when the input URL was copied to path.
	Staged func(input, path string)
	// Prepared, when not nil, is called once the epoch is prepared (the
	// command logs the feature cache and the truncation there).
	Prepared func(*Prepared)
	// Source, when not nil, returns the run's step source (nil: a local
	// Preprocessor) and its clean-up, called when the run ends.
	Source func(ctx context.Context, prep *Prepared) (StepSource, func(), error)
	// Progress, when not nil, is called after each preprocessed step.
	Progress func(done, total int)
}

// ShardResult is what RunShard wrote and planned.
type ShardResult struct {
	// Input is how the summary names the input: the path read (a staged
	// URL's local copy), or the mixture (Config.InputName).
	Input   string
	Summary ShardSummary
	Report  *balancer.Report
	Plan    *balancer.Plan
	Seen    int64
	Elapsed time.Duration
}

// RunShard is `mmfeed shard`: it opens the input (an input URL with
// OpenInput), prepares and plans the epoch, writes the shard set
// (ShardFrom), plan.jsonl with the weights the files store, the report
// (report.json, report.html with thumbnails) and quarantine.jsonl (also
// after an error) into j.Out.
func RunShard(ctx context.Context, j ShardJob) (ShardResult, error) {
	var res ShardResult
	cfg, o := j.Config, j.Options
	if IsURL(cfg.Input) {
		in, err := OpenInput(ctx, cfg.Input, InputCacheDir(j.InputCache, cfg.Input))
		if err != nil {
			return res, err
		}
		defer in.Close()
		if in.Staged && j.Staged != nil {
			j.Staged(cfg.Input, in.Path)
		}
		cfg.Input, cfg.Loader.Remote = in.Path, in.Remote
	}
	if err := o.Validate(cfg.Image.DType); err != nil {
		return res, err
	}
	st, err := OpenStore(ctx, j.Out)
	if err != nil {
		return res, err
	}
	defer st.Close()
	var quarantine bytes.Buffer // written to the store at the end, also after an error
	defer func() { _ = st.WriteFile(context.WithoutCancel(ctx), "quarantine.jsonl", copyOf(&quarantine)) }()
	start := time.Now()
	prep, err := Prepare(ctx, cfg, &quarantine)
	if err != nil {
		return res, err
	}
	defer prep.Close()
	if j.Prepared != nil {
		j.Prepared(prep)
	}
	plan, err := prep.Plan(cfg.Plan.Strategy)
	if err != nil {
		return res, err
	}
	var src StepSource
	if j.Source != nil {
		var closeSrc func()
		if src, closeSrc, err = j.Source(ctx, prep); err != nil {
			return res, err
		}
		defer closeSrc()
	}
	sum, err := ShardFrom(ctx, prep, plan, st, o, src, j.Progress)
	if err != nil {
		return res, err
	}
	// plan.jsonl holds the weights the files store: 0 for a sample that failed to decode.
	if err := st.WriteFile(ctx, "plan.jsonl", StoredPlan(plan, sum.Failed).WriteJSONL); err != nil {
		return res, err
	}
	// The report is written last so that its quarantine count includes decode failures.
	rep, err := prep.Report()
	if err != nil {
		return res, err
	}
	if rep.Thumbnails, err = Thumbnails(ctx, prep, plan, j.Thumbnails); err != nil {
		return res, err
	}
	if err := st.WriteFile(ctx, "report.json", rep.WriteJSON); err != nil {
		return res, err
	}
	mix := prep.MixtureReport(plan) // nil for a plain input
	if err := st.WriteFile(ctx, "report.html", func(w io.Writer) error { return WriteReportHTML(w, rep, mix) }); err != nil {
		return res, err
	}
	return ShardResult{Input: cfg.InputName(), Summary: sum, Report: rep, Plan: plan, Seen: prep.Seen(), Elapsed: time.Since(start)}, nil
}

func copyOf(b *bytes.Buffer) func(io.Writer) error {
	return func(w io.Writer) error { _, err := w.Write(b.Bytes()); return err }
}
