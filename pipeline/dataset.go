package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/internal/ctxutil"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/tokenize"
)

// Dataset is a dataset opened once per job: the index of Config.Input (or of
// Config.Mixture's sources, combined: mixture.go), the
// tokenizer, the image processor, the index scan's rejects and, from the
// first Epoch on, every entry's features (computed once, or read from
// Config.FeatureCache once). Epoch orders it for an epoch: what the planner
// and the preprocessing of that epoch need, with no index, tokenizer or
// feature work repeated.
//
// A Dataset is safe for concurrent use: epochs may be ordered while others
// are preprocessed (the index's reads and the tokenizer are safe for
// concurrent use). Its owner closes it once nothing uses it any more: the
// Prepared epochs it returned share its index and tokenizer and do not
// close them.
type Dataset struct {
	// Config is the configuration the dataset was opened with. Its Plan is
	// not used: each Epoch brings its own.
	Config    Config
	Index     *loader.Index
	Tokenizer *tokenize.Tokenizer
	// Quarantine receives the index scan's rejects (and, through
	// Preprocessor, the rows that fail to preprocess) for the writer
	// OpenDataset was given.
	Quarantine *loader.QuarantineWriter

	proc    *imgproc.Processor
	input   Input           // the opened Config.Input when it was a URL (closed by Close)
	mix     *mixtureSet     // Config.Mixture's sources (nil: Config.Input)
	scanned []loader.Reject // the index scan's rejects, in scan order
	thumbs  thumbCache      // the report thumbnails of its epochs

	mu   sync.Mutex
	load *featureLoad // the feature pass (nil: not started)
	// passes counts the feature passes run (computed, or read from the
	// cache): 1 per dataset unless one failed (tests).
	passes atomic.Int64
}

// featureLoad is the dataset's one feature pass: every entry's features in
// index order, the cache's fingerprint and state.
type featureLoad struct {
	done        chan struct{}
	all         []EntryFeatures // nil when store holds them
	store       *featureStore   // the features, compactly (compactFeatures)
	fingerprint string
	cached      bool
	cacheErr    error
	err         error
}

// OpenDataset indexes cfg.Input and opens the tokenizer and the image
// processor. An input URL (s3://, gs://, az://, http(s)://, file://) is opened
// with OpenInput (streamed or staged under cfg.InputCache), and the dataset's
// Config names what the loader reads (the local path or object key, and
// Loader.Remote). Rejects of the index scan go to quarantine (nil: counted only)
// and are kept, so that every Epoch quarantines them again. The feature pass
// runs on the first Epoch. The caller closes the result.
func OpenDataset(ctx context.Context, cfg Config, quarantine io.Writer) (*Dataset, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg, in, err := openConfigInput(ctx, cfg)
	if err != nil {
		return nil, err
	}
	d := &Dataset{Config: cfg, input: in, Quarantine: loader.NewQuarantineWriter(quarantine)}
	var mu sync.Mutex
	opts := cfg.Loader
	opts.OnReject = func(r loader.Reject) {
		mu.Lock()
		d.scanned = append(d.scanned, r)
		mu.Unlock()
		_ = d.Quarantine.Write(r)
	}
	if d.Tokenizer, err = openTokenizer(cfg); err != nil { // before the index: fail fast
		_ = in.Close()
		return nil, err
	}
	if cfg.Mixture != nil {
		d.mix, err = openMixture(ctx, cfg, opts.OnReject)
		if err == nil {
			d.Index = d.mix.index.Index
		}
	} else {
		d.Index, err = loader.BuildIndex(ctx, cfg.Input, opts)
	}
	if err != nil {
		d.Tokenizer.Close()
		_ = in.Close()
		return nil, fmt.Errorf("pipeline: index %s: %w", cfg.InputName(), err)
	}
	d.proc, err = imgproc.NewProcessor(cfg.Image)
	if err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// ErrVocab: the tokenizer has more ids than the model's embedding
// (Config.ModelVocab).
var ErrVocab = errors.New("tokenizer vocabulary larger than the model's")

// openTokenizer opens cfg's tokenizer and checks it against cfg.ModelVocab.
func openTokenizer(cfg Config) (*tokenize.Tokenizer, error) {
	tk, err := tokenize.Open(cfg.Tokenizer)
	if err != nil {
		return nil, err
	}
	if vocab, _ := TokenizerMeta(tk); cfg.ModelVocab > 0 && vocab > cfg.ModelVocab {
		tk.Close()
		return nil, fmt.Errorf("pipeline: the tokenizer has %d ids and model %s embeds %d: the trainer would refuse the batches at its first step; "+
			"give a --model whose vocab_size is at least %d (a preset or FILE.json), or leave --model out when the trainer grows its embedding (--resize-vocab): %w",
			vocab, cfg.ModelName, cfg.ModelVocab, vocab, ErrVocab)
	}
	return tk, nil
}

// Close releases the tokenizer, the index and an opened input URL (a
// mixture's: every source's).
func (d *Dataset) Close() error {
	if d.Tokenizer != nil {
		d.Tokenizer.Close()
	}
	err := errors.Join(d.Index.Close(), d.input.Close())
	if d.mix != nil {
		err = errors.Join(err, d.mix.closeInputs())
	}
	return err
}

// Epoch orders the dataset for (plan.Seed, plan.Epoch) and reduces it to
// planner items: what Prepare gives, for plan (the job's config with its
// Plan replaced). Quarantine receives the epoch's rejects: the index scan's
// and the feature pass's, in the order Prepare writes them (and, through
// the result, the planner's and the preprocessing's). The first call runs
// the feature pass (Config.Features, Config.FeatureCache, or on
// Config.Workers goroutines); concurrent calls share it, and one that failed
// is tried again. The result shares the dataset's index and tokenizer: its
// Close leaves them open.
func (d *Dataset) Epoch(ctx context.Context, plan balancer.Config, quarantine io.Writer) (*Prepared, error) {
	if err := plan.Validate(); err != nil {
		return nil, err
	}
	l, err := d.features(ctx)
	if err != nil {
		return nil, err
	}
	cfg := d.Config
	cfg.Plan = plan
	q := loader.NewQuarantineWriter(quarantine)
	for _, r := range d.scanned {
		q.Write(r)
	}
	p := &Prepared{Config: cfg, Index: d.Index, Quarantine: q, Tokenizer: d.Tokenizer, ds: d,
		Fingerprint: l.fingerprint, FeaturesCached: l.cached, FeatureCacheErr: l.cacheErr}
	perm, repeats := d.order(plan.Seed, uint64(plan.Epoch))
	if l.store != nil {
		p.Features, err = orderStored(d.Index, l.store, perm, repeats, q)
	} else {
		p.Features, err = orderFeatures(d.Index, l.all, perm, repeats, q)
	}
	if err != nil {
		return nil, err
	}
	if err := checkSomeLeft(d.Config.Input, len(p.Features.Items), q, d.scanned); err != nil {
		return nil, err
	}
	augmentFeatures(&p.Features, cfg.Image, plan.Epoch)
	return p, nil
}

// order is the epoch order of (seed, epoch): a permutation of the index, or
// a mixture's draws (entry positions and their repeats, nil when none).
func (d *Dataset) order(seed, epoch uint64) ([]int, []int32) {
	if d.mix != nil {
		return d.mix.order(seed, epoch)
	}
	return loader.Permutation(d.Index.Len(), seed, epoch), nil
}

// features returns the dataset's feature pass, running it on the first
// call; a caller whose ctx ends while another runs it returns ctx's error,
// and a pass that failed is run again by the next caller.
func (d *Dataset) features(ctx context.Context) (*featureLoad, error) {
	for {
		d.mu.Lock()
		l := d.load
		run := l == nil || (ctxutil.Closed(l.done) && l.err != nil)
		if run {
			l = &featureLoad{done: make(chan struct{})}
			d.load = l
		}
		d.mu.Unlock()
		if run {
			d.runFeatures(ctx, l)
		}
		select {
		case <-l.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if l.err == nil {
			return l, nil
		}
		if ctx.Err() != nil || !(errors.Is(l.err, context.Canceled) || errors.Is(l.err, context.DeadlineExceeded)) || run {
			return nil, l.err
		}
		// another caller's ctx ended its pass: run it with ours
	}
}

// runFeatures computes (or reads from the cache) every entry's features in
// index order.
func (d *Dataset) runFeatures(ctx context.Context, l *featureLoad) {
	defer close(l.done)
	d.passes.Add(1)
	cfg := d.Config
	switch {
	case cfg.FeatureCache != nil:
		l.all, l.fingerprint, l.cached, l.cacheErr, l.err = d.cachedFeatures(ctx)
	case cfg.Features != nil:
		l.all, l.err = cfg.Features(ctx, d.Index)
	default:
		l.all, l.err = computeFeatures(ctx, d.Index, indexList(d.Index), d.Tokenizer, cfg.Image, cfg.workers(), cfg.Progress)
	}
	if l.err == nil && len(l.all) != d.Index.Len() {
		l.err = fmt.Errorf("pipeline: features of %d entries for an index of %d", len(l.all), d.Index.Len())
	}
	if l.err == nil {
		if s, ok := compactFeatures(d.Index, l.all); ok {
			l.store, l.all = s, nil
		}
	}
}

// FeaturePasses is how many feature passes the dataset ran (or read from the
// cache): one, unless a pass failed and was run again.
func (d *Dataset) FeaturePasses() int { return int(d.passes.Load()) }

// Preprocessor returns a Preprocessor of the dataset for Preprocessor.Row
// (a worker's batch items): no epoch, rejects to d.Quarantine.
func (d *Dataset) Preprocessor() *Preprocessor {
	return newPreprocessor(&Prepared{Config: d.Config, Index: d.Index, Quarantine: d.Quarantine, Tokenizer: d.Tokenizer, ds: d}, d.proc)
}
