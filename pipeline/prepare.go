package pipeline

import (
	"context"
	"io"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/tokenize"
)

// Prepared is a dataset ordered for one epoch and reduced to planner items
// (Dataset.Epoch, Prepare).
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

	ds   *Dataset       // the dataset it orders (its index, tokenizer, image processor)
	owns bool           // Close closes ds (Prepare)
	plan *balancer.Plan // the configured strategy's plan, once built
}

// Prepare opens cfg.Input (OpenDataset) and orders it for (seed, epoch)
// (Dataset.Epoch): the dataset of a job that plans one epoch (`shard`,
// `report`). Rejects of every stage are written to quarantine as JSON lines.
// The caller closes the result, which closes the dataset.
func Prepare(ctx context.Context, cfg Config, quarantine io.Writer) (*Prepared, error) {
	d, err := OpenDataset(ctx, cfg, nil)
	if err != nil {
		return nil, err
	}
	p, err := d.Epoch(ctx, cfg.Plan, quarantine)
	if err != nil {
		d.Close()
		return nil, err
	}
	p.owns = true
	return p, nil
}

// Close releases the tokenizer and the index when the Prepared owns its
// dataset (Prepare); one of Dataset.Epoch leaves them to the dataset's owner.
func (p *Prepared) Close() error {
	if p.owns && p.ds != nil {
		return p.ds.Close()
	}
	return nil
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
			e := p.Features.Entry(int(r.Item))
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
	r.Kept = KeptReport(p.Index)
	r.TextTruncation = p.TextTruncation()
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
