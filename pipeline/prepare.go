package pipeline

import (
	"context"
	"io"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/tokenize"
)

// Prepared is a dataset indexed, shuffled for the epoch and reduced to planner items.
type Prepared struct {
	Config     Config
	Index      *loader.Index
	Features   Features
	Quarantine *loader.QuarantineWriter
	Tokenizer  *tokenize.Tokenizer
	// Fingerprint names the dataset and settings the features came from
	// (Fingerprint), and FeaturesCached says they were read from
	// Config.FeatureCache; FeatureCacheErr is why the cache could not be read
	// or written (the features were computed then). All zero without a cache.
	Fingerprint     string
	FeaturesCached  bool
	FeatureCacheErr error

	plan *balancer.Plan // the configured strategy's plan, once built
}

// Prepare indexes cfg.Input, orders it for (seed, epoch) and extracts features (from
// cfg.FeatureCache when it holds the dataset's Fingerprint). Rejects of every stage are
// written to quarantine as JSON lines. The caller closes the result.
func Prepare(ctx context.Context, cfg Config, quarantine io.Writer) (*Prepared, error) {
	p, err := OpenDataset(ctx, cfg, quarantine)
	if err != nil {
		return nil, err
	}
	order := p.Index.Order(cfg.Plan.Seed, uint64(cfg.Plan.Epoch))
	if cfg.Features != nil || cfg.FeatureCache != nil {
		var all []EntryFeatures
		if cfg.FeatureCache != nil {
			all, p.FeatureCacheErr, err = p.cachedFeatures(ctx, cfg)
		} else {
			all, err = cfg.Features(ctx, p.Index)
		}
		if err == nil {
			p.Features, err = assembleFeatures(p.Index, all, order, p.Quarantine)
		}
	} else {
		p.Features, err = extractFeatures(ctx, p.Index, order, p.Tokenizer, cfg.Image, p.Quarantine, cfg.workers(), cfg.Progress)
	}
	if err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Close releases the tokenizer and the index.
func (p *Prepared) Close() error {
	p.Tokenizer.Close()
	return p.Index.Close()
}

// Seen is the number of samples the source held (quarantined ones included).
func (p *Prepared) Seen() int64 { return p.Index.Stats.Seen }

// Plan builds the plan of one strategy. The configured strategy's plan is built once,
// and its planner rejections are quarantined once.
func (p *Prepared) Plan(strategy balancer.Strategy) (*balancer.Plan, error) {
	if strategy == p.Config.Plan.Strategy && p.plan != nil {
		return p.plan, nil
	}
	c := p.Config.Plan
	c.Strategy = strategy
	plan, err := balancer.Build(p.Features.Items, c)
	if err != nil {
		return nil, err
	}
	if strategy == p.Config.Plan.Strategy {
		p.plan = plan
		for _, r := range plan.Rejected {
			e := p.Features.Entries[r.Item]
			p.Quarantine.Write(loader.Reject{ID: e.ID, Location: e.Location, Reason: "plan_rejected", Detail: r.Reason})
		}
	}
	return plan, nil
}

// Report compares the three strategies on the prepared items. Quarantined counts every
// stage: source, features and planner.
func (p *Prepared) Report() (*balancer.Report, error) {
	plans := make([]*balancer.Plan, 0, 3)
	first, err := p.Plan(p.Config.Plan.Strategy)
	if err != nil {
		return nil, err
	}
	plans = append(plans, first)
	for _, s := range balancer.Strategies() {
		if s == p.Config.Plan.Strategy {
			continue
		}
		c := p.Config.Plan
		c.Strategy = s
		pl, err := balancer.Build(p.Features.Items, c)
		if err != nil {
			return nil, err
		}
		plans = append(plans, pl)
	}
	r, err := balancer.NewReport(plans...)
	if err != nil {
		return nil, err
	}
	r.Quarantined = int(p.Quarantine.Total())
	r.QuarantineReasons = QuarantineReasons(p.Quarantine)
	return r, p.Quarantine.Err()
}

// TokenizerMeta returns the vocabulary size and pad id (-1: none) that
// batches built with tk carry in their schema metadata; 0, -1 for no tokenizer.
func TokenizerMeta(tk *tokenize.Tokenizer) (vocab, pad int) {
	if tk == nil {
		return 0, -1
	}
	pad, ok := tk.PadID()
	if !ok {
		pad = -1
	}
	return tk.VocabSize(), pad
}
