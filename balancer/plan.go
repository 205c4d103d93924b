package balancer

import (
	"cmp"
	"fmt"
	"iter"
	"slices"
)

// Entry is one sample slot in a micro-batch.
type Entry struct {
	// Item indexes the items slice the plan was built from.
	Item int32 `json:"item"`
	// Weight is 1 for a real sample and 0 for a padding copy.
	Weight float32 `json:"weight"`
	// Delay is the step the entry is placed in minus the step its global batch
	// arrived in (negative: pulled forward). 0 for padding.
	Delay int32 `json:"delay"`
}

// MicroBatch is the entries of one micro-batch, longest text first.
type MicroBatch []Entry

// Step is one global batch: Ranks[r][m] is rank r's micro-batch m. Every step
// has exactly DP ranks with exactly MicroBatches non-empty micro-batches.
type Step struct {
	Index int            `json:"step"`
	Ranks [][]MicroBatch `json:"ranks"`
}

// Rejection records an item that was not planned, with the reason.
type Rejection struct {
	Item   int32  `json:"item"`
	Reason string `json:"reason"`
}

// Plan is an epoch's assignment of samples to steps, ranks and micro-batches.
// It is immutable after Build.
type Plan struct {
	// Config is the configuration the plan was built with.
	Config Config
	// Steps in order; Steps[i].Index is the absolute step number.
	Steps []Step
	// Dropped lists the items of the incomplete last global batch under
	// TailDrop.
	Dropped []int32
	// Rejected lists items that cannot be planned (invalid, duplicate id, or
	// alone larger than the micro-batch budget).
	Rejected []Rejection
	// MaxDelay and MinDelay bound the entries' Delay.
	MaxDelay, MinDelay int

	items []Item
}

// Items returns the items the plan indexes (shared, do not modify).
func (p *Plan) Items() []Item { return p.items }

// From returns the plan's steps with Index ≥ step, for resuming. The dropped
// and rejected lists are kept (they are per epoch).
func (p *Plan) From(step int) *Plan {
	q := *p
	i, _ := slices.BinarySearchFunc(p.Steps, step, func(s Step, t int) int { return cmp.Compare(s.Index, t) })
	q.Steps = p.Steps[i:]
	return &q
}

// Build plans an epoch of items (in the epoch's shuffled order) with cfg.
// Items that cannot be planned are listed in Plan.Rejected rather than failing
// the build; an error means the configuration cannot be satisfied. It is
// [Start] and [Planner.PlanNext] until every window is planned.
func Build(items []Item, cfg Config) (*Plan, error) {
	p, err := Start(items, cfg)
	if err != nil {
		return nil, err
	}
	for more := !p.Done(); more; {
		if more, err = p.PlanNext(); err != nil {
			return nil, err
		}
	}
	return p.Plan(), nil
}

type builder struct {
	cfg   Config
	items []Item
	costs []Cost
	plan  *Plan
	part  *Partitioner
}

// reject moves invalid, duplicate and oversize items to Plan.Rejected and
// returns the rest in order.
func (b *builder) reject() []int32 {
	seen := make(map[string]struct{}, len(b.items))
	valid := make([]int32, 0, len(b.items))
	for i, it := range b.items {
		err := it.Validate()
		if err == nil {
			if _, dup := seen[it.ID]; dup {
				err = fmt.Errorf("balancer: item %q: duplicate id: %w", it.ID, ErrInvalidItem)
			}
		}
		if err == nil && b.cfg.Strategy == StrategyMmfeed {
			err = b.cfg.Budget.ItemFits(it)
		}
		if err != nil {
			b.plan.Rejected = append(b.plan.Rejected, Rejection{Item: int32(i), Reason: err.Error()})
			continue
		}
		seen[it.ID] = struct{}{}
		valid = append(valid, int32(i))
	}
	return valid
}

// batch is one global batch in arrival order.
type batch struct {
	items   []int32
	arrival int  // index of the batch in arrival order
	pad     bool // the incomplete tail kept under TailPad
}

// slice cuts the valid items into global batches and applies the tail policy.
func (b *builder) slice(valid []int32) []batch {
	var out []batch
	minCount := b.cfg.DP * b.cfg.MicroBatches
	complete := true
	if b.cfg.GlobalBatch > 0 {
		for start := 0; start < len(valid); start += b.cfg.GlobalBatch {
			end := min(start+b.cfg.GlobalBatch, len(valid))
			out = append(out, batch{items: valid[start:end:end], arrival: len(out)})
			complete = end-start == b.cfg.GlobalBatch
		}
	} else {
		longest := 0
		for _, i := range valid {
			longest = max(longest, b.cfg.stepTokens(b.items[i]))
		}
		start, tokens := 0, 0
		for k, i := range valid {
			l := b.cfg.stepTokens(b.items[i])
			if k-start >= minCount && tokens+l > b.cfg.GlobalTokens {
				out = append(out, batch{items: valid[start:k:k], arrival: len(out)})
				start, tokens = k, 0
			}
			tokens += l
		}
		if start < len(valid) {
			out = append(out, batch{items: valid[start:len(valid):len(valid)], arrival: len(out)})
			complete = len(valid)-start >= minCount && tokens >= b.cfg.GlobalTokens-longest
		}
	}
	if len(out) == 0 || complete {
		return out
	}
	last := out[len(out)-1]
	if b.cfg.Tail == TailDrop {
		b.plan.Dropped = append(b.plan.Dropped, last.items...)
		return out[:len(out)-1]
	}
	out[len(out)-1].pad = true
	return out
}

// stepTokens is what GlobalTokens counts of an item: its text tokens, or
// with Pack its text and image tokens.
func (c Config) stepTokens(it Item) int {
	if c.Pack {
		return it.TextTokens + it.ImageTokens
	}
	return it.TextTokens
}

// delays returns the largest and smallest entry delay.
func delays(steps []Step) (hi, lo int) {
	for _, s := range steps {
		for _, r := range s.Ranks {
			for _, mb := range r {
				for _, e := range mb {
					hi, lo = max(hi, int(e.Delay)), min(lo, int(e.Delay))
				}
			}
		}
	}
	return hi, lo
}

// windows cuts n steps into lookahead windows of at most la steps, as few as
// possible and of sizes differing by at most one, so that the last window is
// not left with a step or two to balance alone. It yields (start, size).
func windows(n, la int) iter.Seq2[int, int] {
	return func(yield func(int, int) bool) {
		if n <= 0 {
			return
		}
		count := (n + la - 1) / la
		start := 0
		for w := range count {
			size := n / count
			if w < n%count {
				size++
			}
			if !yield(start, size) {
				return
			}
			start += size
		}
	}
}
