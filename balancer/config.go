package balancer

import (
	"fmt"
	"strings"
)

// Strategy selects how a global batch is split across ranks.
type Strategy int

// Strategies. All produce the same Plan type.
const (
	// StrategyMmfeed balances cost across ranks with length-homogeneous
	// micro-batches (Partitioner) and a lookahead window across steps.
	StrategyMmfeed Strategy = iota
	// StrategyRandom is DistributedSampler: rank r takes positions r, r+dp, …
	// of the step's slice of the shuffled order; micro-batches are consecutive
	// equal chunks.
	StrategyRandom
	// StrategyLengthGrouped is HuggingFace LengthGroupedSampler: each
	// micro-batch round is a megabatch of dp × micro-batch-size samples sorted
	// by length (longest first) and cut into consecutive chunks per rank.
	StrategyLengthGrouped
	numStrategies
)

var strategyNames = [numStrategies]string{"mmfeed", "random", "length_grouped"}

// Strategies returns every strategy, mmfeed first.
func Strategies() []Strategy {
	return []Strategy{StrategyMmfeed, StrategyRandom, StrategyLengthGrouped}
}

// String returns "mmfeed", "random" or "length_grouped".
func (s Strategy) String() string {
	if s < 0 || s >= numStrategies {
		return fmt.Sprintf("Strategy(%d)", int(s))
	}
	return strategyNames[s]
}

// ParseStrategy parses a strategy name (case-insensitive; "-" and "_" alike).
func ParseStrategy(s string) (Strategy, error) {
	t := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "-", "_")
	for i, n := range strategyNames {
		if t == n {
			return Strategy(i), nil
		}
	}
	return 0, fmt.Errorf("balancer: strategy %q (want mmfeed|random|length_grouped): %w", s, ErrUnknownName)
}

// MarshalText implements encoding.TextMarshaler.
func (s Strategy) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *Strategy) UnmarshalText(b []byte) error {
	v, err := ParseStrategy(string(b))
	if err == nil {
		*s = v
	}
	return err
}

// Tail selects what happens to the incomplete last global batch of an epoch.
type Tail int

// Tails.
const (
	// TailDrop drops the incomplete last global batch; its ids are listed in
	// Plan.Dropped.
	TailDrop Tail = iota
	// TailPad keeps it and fills it with zero-weight copies of real samples.
	TailPad
)

// String returns "drop" or "pad".
func (t Tail) String() string {
	switch t {
	case TailDrop:
		return "drop"
	case TailPad:
		return "pad"
	}
	return fmt.Sprintf("Tail(%d)", int(t))
}

// ParseTail parses "drop" or "pad" (case-insensitive).
func ParseTail(s string) (Tail, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "drop":
		return TailDrop, nil
	case "pad":
		return TailPad, nil
	}
	return 0, fmt.Errorf("balancer: tail %q (want drop|pad): %w", s, ErrUnknownName)
}

// MarshalText implements encoding.TextMarshaler.
func (t Tail) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (t *Tail) UnmarshalText(b []byte) error {
	v, err := ParseTail(string(b))
	if err == nil {
		*t = v
	}
	return err
}

// Sync says where the trainer's data-parallel ranks wait for each other
// within a step, which decides what a step costs.
type Sync int

// Syncs.
const (
	// SyncMicroBatch: the ranks meet at every micro-batch (an all-gather of
	// contrastive embeddings, as the bundled trainer does, or a pipeline
	// stage), so a step costs Σ over micro-batch positions of the slowest
	// rank's micro-batch there. The default.
	SyncMicroBatch Sync = iota
	// SyncStep: the ranks meet only at the gradient all-reduce, so a step
	// costs the slowest rank's total.
	SyncStep
)

// String returns "micro-batch" or "step".
func (s Sync) String() string {
	switch s {
	case SyncMicroBatch:
		return "micro-batch"
	case SyncStep:
		return "step"
	}
	return fmt.Sprintf("Sync(%d)", int(s))
}

// ParseSync parses "micro-batch" (or "microbatch", "micro_batch") or "step".
func ParseSync(s string) (Sync, error) {
	switch strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(strings.TrimSpace(s))) {
	case "microbatch":
		return SyncMicroBatch, nil
	case "step":
		return SyncStep, nil
	}
	return 0, fmt.Errorf("balancer: sync %q (want micro-batch|step): %w", s, ErrUnknownName)
}

// MarshalText implements encoding.TextMarshaler.
func (s Sync) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *Sync) UnmarshalText(b []byte) error {
	v, err := ParseSync(string(b))
	if err == nil {
		*s = v
	}
	return err
}

// Config configures Build. The plan is a pure function of (items, Config).
type Config struct {
	// DP is the number of data-parallel ranks.
	DP int `json:"dp"`
	// MicroBatches is the number of micro-batches per rank and step.
	MicroBatches int `json:"micro_batches"`
	// GlobalBatch is the number of samples per step (all ranks together).
	// Exactly one of GlobalBatch and GlobalTokens is positive.
	GlobalBatch int `json:"global_batch,omitempty"`
	// GlobalTokens closes a step before its real tokens would exceed it (a
	// step always holds at least DP × MicroBatches samples): text tokens,
	// or with Pack text + image tokens, as dynamic-resolution trainers
	// define a step.
	GlobalTokens int `json:"global_tokens,omitempty"`
	// Budget bounds every micro-batch (mmfeed only; the baselines reproduce
	// their samplers and ignore it).
	Budget Budget `json:"budget"`
	// Pack says the trainer packs each micro-batch (captions concatenated,
	// image patches concatenated, attention within each sample) instead of
	// padding it: a micro-batch then costs Σ of its samples' own costs plus
	// CostModel.MicroBatchOverhead (PackedFeatures), Budget.MaxTokens bounds
	// it and Budget.MaxPaddedTokens must be 0.
	Pack bool `json:"pack,omitempty"`
	// Placement selects the step cost: colocated or modality.
	Placement Placement `json:"placement"`
	// PP is the trainer's pipeline stages (0 or 1: none): above 1 the step
	// cost is pipelined (PipelineStepCost) and mmfeed levels micro-batches
	// within each rank too. Part of the world layout, so of the plan.
	PP int `json:"pp,omitempty"`
	// Sync says where the ranks wait for each other (the step cost every
	// strategy is measured with, and what mmfeed minimises).
	Sync Sync `json:"sync"`
	// Tail selects what happens to the incomplete last global batch.
	Tail Tail `json:"tail"`
	// Lookahead is the number of global batches in the window within which
	// mmfeed may move samples between steps (1 = none). A sample's delay is
	// bounded by Lookahead − 1 steps either way.
	Lookahead int `json:"lookahead"`
	// Strategy selects the splitter.
	Strategy Strategy `json:"strategy"`
	// Seed is the epoch shuffle seed; recorded in the plan (the items arrive
	// already shuffled, so the planner itself draws no random numbers).
	Seed uint64 `json:"seed"`
	// Epoch is the epoch number, written on every plan line.
	Epoch int `json:"epoch"`
	// PaddingTarget is mmfeed's soft padding preference (see
	// PartitionConfig.PaddingTarget).
	PaddingTarget float64 `json:"padding_target"`
	// Model is the cost model; the zero value means the tiny preset.
	Model CostModel `json:"model"`
}

// DefaultConfig returns dp 8, 4 micro-batches, global batch 128, colocated,
// tail drop, lookahead 4, mmfeed, padding target 0.95, tiny cost model.
func DefaultConfig() Config {
	m, _ := NewCostModel(TinyShape())
	return Config{
		DP: 8, MicroBatches: 4, GlobalBatch: 128, Lookahead: 4,
		PaddingTarget: 0.95, Model: m,
	}
}

// MaxLookahead bounds Config.Lookahead.
const MaxLookahead = 1024

// Validate checks the fields.
func (c Config) Validate() error {
	pc := c.partitionConfig()
	if err := pc.Validate(); err != nil {
		return err
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("balancer: "+format+": %w", append(a, ErrInvalidConfig)...)
	}
	switch {
	case (c.GlobalBatch > 0) == (c.GlobalTokens > 0):
		return bad("exactly one of global batch (%d) and global tokens (%d) must be positive", c.GlobalBatch, c.GlobalTokens)
	case c.GlobalBatch < 0 || c.GlobalTokens < 0:
		return bad("negative global batch %d or tokens %d", c.GlobalBatch, c.GlobalTokens)
	case c.GlobalBatch > 0 && c.GlobalBatch < c.DP*c.MicroBatches:
		return bad("global batch %d < dp %d × micro-batches %d", c.GlobalBatch, c.DP, c.MicroBatches)
	case c.Pack && c.Budget.MaxPaddedTokens > 0:
		return bad("packed plans bound tokens with max_tokens, not max_padded_tokens (%d)", c.Budget.MaxPaddedTokens)
	case !c.Pack && c.Budget.MaxTokens > 0:
		return bad("max_tokens (%d) bounds packed micro-batches; padded plans use max_padded_tokens", c.Budget.MaxTokens)
	case c.Tail != TailDrop && c.Tail != TailPad:
		return bad("tail %v", c.Tail)
	case c.Lookahead < 1 || c.Lookahead > MaxLookahead:
		return bad("lookahead %d outside [1, %d]", c.Lookahead, MaxLookahead)
	case c.Strategy < 0 || c.Strategy >= numStrategies:
		return bad("strategy %v", c.Strategy)
	case c.Epoch < 0:
		return bad("epoch %d", c.Epoch)
	}
	return c.model().Validate()
}

func (c Config) partitionConfig() PartitionConfig {
	return PartitionConfig{
		DP: c.DP, MicroBatches: c.MicroBatches, Budget: c.Budget,
		Placement: c.Placement, Sync: c.Sync, PaddingTarget: c.PaddingTarget, Model: c.model(),
		Pack: c.Pack, PP: c.PP,
	}
}

// model returns the configured cost model, the tiny preset when zero.
func (c Config) model() CostModel {
	if c.Model == (CostModel{}) {
		m, _ := NewCostModel(TinyShape())
		return m
	}
	return c.Model
}
