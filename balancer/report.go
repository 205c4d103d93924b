package balancer

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
)

// Report compares strategies on the same items. It serialises to JSON with
// encoding/json (map keys sorted, so the bytes are deterministic).
type Report struct {
	// Samples is the number of real entries planned by the mmfeed plan.
	Samples int `json:"samples"`
	// Quarantined counts samples that never reached the planner (set by the
	// caller, e.g. the loader's quarantine) plus the planner's rejections.
	Quarantined int `json:"quarantined"`
	// Rejected counts the planner's rejections (included in Quarantined).
	Rejected int `json:"rejected"`
	// Dropped counts samples of a dropped tail.
	Dropped      int `json:"dropped"`
	Steps        int `json:"steps"`
	DP           int `json:"dp"`
	MicroBatches int `json:"micro_batches"`
	// PP is the trainer's pipeline stages the step costs assume (omitted: none).
	PP           int    `json:"pp,omitempty"`
	GlobalBatch  int    `json:"global_batch,omitempty"`
	GlobalTokens int    `json:"global_tokens,omitempty"`
	Lookahead    int    `json:"lookahead"`
	Placement    string `json:"placement"`
	Sync         string `json:"sync"`
	Pack         bool   `json:"pack,omitempty"`
	Tail         string `json:"tail"`
	Epoch        int    `json:"epoch"`
	// Unit is the cost unit ("GFLOP" or "s").
	Unit string `json:"unit"`
	// Strategies maps strategy names to their summaries.
	Strategies map[string]Summary `json:"strategies"`
	// SpeedupVsRandom is random's StepCostSum over mmfeed's.
	SpeedupVsRandom float64 `json:"speedup_vs_random"`
	// MaxDelay and MinDelay bound the mmfeed plan's sample delays (steps).
	MaxDelay int `json:"max_delay"`
	MinDelay int `json:"min_delay"`
	// PlanHash is the mmfeed plan's Hash.
	PlanHash string `json:"plan_hash,omitempty"`
	// Detail holds every step (up to MaxDetailSteps) of every strategy: per-rank
	// cost, imbalance and efficiency, in strategy then step order.
	Detail []StepDetail `json:"detail,omitempty"`
	// Histograms describe the mmfeed plan's real samples: "text_tokens",
	// "image_tokens" and "cost" (the sample's own cost under the placement).
	Histograms map[string]Histogram `json:"histograms,omitempty"`
	// QuarantineReasons counts quarantined samples by reason with a few
	// example ids (set by the caller, who owns the quarantine).
	QuarantineReasons map[string]QuarantineGroup `json:"quarantine_reasons,omitempty"`
	// Kept lists the source fields the batches carry (--keep) with the number
	// of indexed samples that lack each (null in the batches); set by the caller.
	Kept []KeptColumn `json:"kept,omitempty"`
	// Thumbnails show the samples that drive cost (set by the caller, who can
	// decode images; the balancer only picks them, see CostDrivers).
	Thumbnails []Thumbnail `json:"thumbnails,omitempty"`
	// TextTruncation counts the captions cut at the tokenizer's maximum
	// length (set by the caller, who knows the tokenizer).
	TextTruncation *TextTruncation `json:"text_truncation,omitempty"`
	// Blockers explain the mmfeed plan's steps that no split can bring
	// within ImbalanceTarget (Plan.Blockers, at most MaxBlockers).
	Blockers []Blocker `json:"blockers,omitempty"`
}

// StepDetail is one step's per-rank cost under one strategy.
type StepDetail struct {
	Strategy  string    `json:"strategy"`
	Step      int       `json:"step"`
	RankCost  []float64 `json:"rank_cost"`
	Imbalance float64   `json:"imbalance"`
	// Slowest is the rank with the largest cost.
	Slowest           int     `json:"slowest"`
	PaddingEfficiency float64 `json:"padding_efficiency"`
	ComputeEfficiency float64 `json:"compute_efficiency"`
}

// MaxDetailSteps bounds the steps per strategy a Report keeps in Detail (the
// first ones); the summaries always cover every step.
const MaxDetailSteps = 4096

// Compare builds the mmfeed, random and length_grouped plans of items with
// cfg (cfg.Strategy is ignored) and reports them side by side.
func Compare(items []Item, cfg Config) (*Report, error) {
	plans := make([]*Plan, 0, numStrategies)
	for _, s := range Strategies() {
		c := cfg
		c.Strategy = s
		p, err := Build(items, c)
		if err != nil {
			return nil, fmt.Errorf("balancer: compare %v: %w", s, err)
		}
		plans = append(plans, p)
	}
	return NewReport(plans...)
}

// NewReport summarises plans built from the same items. The first plan is the
// reference (samples, steps, delays, hash); it should be the mmfeed plan.
func NewReport(plans ...*Plan) (*Report, error) {
	if len(plans) == 0 {
		return nil, fmt.Errorf("balancer: report of no plans: %w", ErrInvalidConfig)
	}
	ref := plans[0]
	c := ref.Config
	r := &Report{
		Rejected: len(ref.Rejected), Quarantined: len(ref.Rejected), Dropped: len(ref.Dropped),
		Steps: len(ref.Steps), DP: c.DP, MicroBatches: c.MicroBatches, PP: c.PP,
		GlobalBatch: c.GlobalBatch, GlobalTokens: c.GlobalTokens, Lookahead: c.Lookahead,
		Placement: c.Placement.String(), Sync: c.Sync.String(), Pack: c.Pack, Tail: c.Tail.String(), Epoch: c.Epoch,
		Unit: c.model().Unit, Strategies: make(map[string]Summary, len(plans)),
		MaxDelay: ref.MaxDelay, MinDelay: ref.MinDelay, PlanHash: ref.Hash(),
	}
	for _, p := range plans {
		stats := p.Stats()
		s := Summarize(stats)
		s.MaxDelay, s.MinDelay = p.MaxDelay, p.MinDelay
		if s.WindowBoundSum = p.WindowLowerBoundSum(); s.WindowBoundSum > 0 {
			var ideal float64
			for _, st := range stats {
				ideal += st.IdealCost
			}
			s.EpochEfficiencyWindowBound = min(1, ideal/s.WindowBoundSum)
		}
		r.Strategies[p.Config.Strategy.String()] = s
		if p == ref && p.Config.Strategy == StrategyMmfeed {
			r.Blockers = p.Blockers(stats, MaxBlockers)
		}
		for _, st := range stats[:min(MaxDetailSteps, len(stats))] {
			r.Detail = append(r.Detail, StepDetail{
				Strategy: p.Config.Strategy.String(), Step: st.Step, RankCost: st.RankCost, Imbalance: st.Imbalance,
				Slowest: argmax(st.RankCost), PaddingEfficiency: st.PaddingEfficiency(),
				ComputeEfficiency: st.ComputeEfficiency(),
			})
		}
	}
	r.Histograms = sampleHistograms(ref)
	r.Samples = r.Strategies[ref.Config.Strategy.String()].Samples
	mm, okM := r.Strategies[StrategyMmfeed.String()]
	rnd, okR := r.Strategies[StrategyRandom.String()]
	if okM && okR && mm.StepCostSum > 0 {
		r.SpeedupVsRandom = rnd.StepCostSum / mm.StepCostSum
	}
	return r, nil
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes a human-readable comparison table.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	mode := "padded"
	if r.Pack {
		mode = "packed"
	}
	if r.PP > 1 {
		mode += fmt.Sprintf(", pp %d", r.PP)
	}
	fmt.Fprintf(tw, "samples %d\tquarantined %d\tdropped %d\tsteps %d\tdp %d\tmicro-batches %d\tplacement %s\tsync %s\t%s\t\n",
		r.Samples, r.Quarantined, r.Dropped, r.Steps, r.DP, r.MicroBatches, r.Placement, r.Sync, mode)
	fmt.Fprintf(tw, "strategy\timb p50\timb p99\timb max\tpadding eff\tcompute eff\tepoch eff\tstep cost sum (%s)\tvs random\t\n", r.Unit)
	rnd := r.Strategies[StrategyRandom.String()].StepCostSum
	for _, s := range Strategies() {
		sm, ok := r.Strategies[s.String()]
		if !ok {
			continue
		}
		speed := 0.0
		if sm.StepCostSum > 0 {
			speed = rnd / sm.StepCostSum
		}
		fmt.Fprintf(tw, "%s\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.6g\t%.3fx\t\n", s, sm.ImbalanceP50, sm.ImbalanceP99,
			sm.ImbalanceMax, sm.PaddingEfficiency, sm.ComputeEfficiency, sm.EpochEfficiency, sm.StepCostSum, speed)
	}
	fmt.Fprintf(tw, "speedup vs random %.3fx\tdelay [%d, %d] steps\tlookahead %d\t\n", r.SpeedupVsRandom, r.MinDelay, r.MaxDelay, r.Lookahead)
	if err := tw.Flush(); err != nil {
		return err
	}
	if mm, ok := r.Strategies[StrategyMmfeed.String()]; ok {
		gap := 1.0
		if mm.CostLowerBoundSum > 0 {
			gap = mm.StepCostSum / mm.CostLowerBoundSum
		}
		_, err := fmt.Fprintf(w, "mmfeed bound (no split of the planned steps does better): epoch efficiency ≤ %.4f, step cost sum %.4f× the bound; imbalance lower bound p99 %.4f, max %.4f, %d steps above %.2f\n",
			mm.EpochEfficiencyBound, gap, mm.ImbalanceLowerBoundP99, mm.ImbalanceLowerBoundMax, mm.StepsBoundAboveTarget, ImbalanceTarget)
		if err == nil && mm.WindowBoundSum <= 0 {
			return writeBlockers(w, r.Blockers, mm.StepsBoundAboveTarget)
		}
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "mmfeed window bound (samples may move within their lookahead window): epoch efficiency ≤ %.4f, step cost sum %.4f× the bound\n",
			mm.EpochEfficiencyWindowBound, mm.StepCostSum/mm.WindowBoundSum)
		return writeBlockers(w, r.Blockers, mm.StepsBoundAboveTarget)
	}
	return nil
}

// tableBlockers is how many Blockers the table prints (--json has them all).
const tableBlockers = 3

// writeBlockers prints the worst blockers, and how many steps are above the
// target in all.
func writeBlockers(w io.Writer, bs []Blocker, above int) error {
	if len(bs) == 0 {
		return nil
	}
	if _, err := fmt.Fprintf(w, "steps no split can bring within %.2f (%d; the worst, with what would lower their bound):\n", ImbalanceTarget, above); err != nil {
		return err
	}
	for _, b := range bs[:min(tableBlockers, len(bs))] {
		if _, err := fmt.Fprintln(w, b); err != nil {
			return err
		}
	}
	return nil
}
