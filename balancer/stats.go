package balancer

import (
	"math"
	"slices"
)

// StepStats describes one step of a plan.
type StepStats struct {
	Step int `json:"step"`
	// RankCost is each rank's step cost under the plan's placement, padded
	// the way the trainer pads: every micro-batch costs its entries × the cost
	// at its longest L and largest P (PaddedFeatures; padding entries included,
	// they are computed even though their weight is 0).
	RankCost []float64 `json:"rank_cost"`
	// MaxCost is the predicted step time: the slowest rank's cost, or with
	// SyncMicroBatch Σ over micro-batch positions of the slowest rank's
	// micro-batch there (the ranks meet at every micro-batch), whichever is
	// larger.
	MaxCost  float64 `json:"max_cost"`
	MeanCost float64 `json:"mean_cost"`
	// Imbalance is MaxCost / MeanCost (1 is perfect).
	Imbalance float64 `json:"imbalance"`
	// ImbalanceLowerBound is RankCostLowerBound of the step's entries'
	// unpadded costs over MeanCost: padding never lowers a cost, so no split
	// of this step's samples over the ranks does better.
	// Above 1 it says the imbalance is the samples' (the lookahead window's
	// choice), not the partitioner's. It is a bound on Imbalance itself only
	// for packed plans, whose mean does not depend on the split; for padded
	// plans compare MaxCost with CostLowerBound.
	ImbalanceLowerBound float64 `json:"imbalance_lower_bound"`
	// IdealCost is what the step's real samples' own (unpadded) costs give
	// if spread perfectly over the dp ranks: colocated Σ cost / dp, modality
	// max(Σ vision, Σ text) / dp + Σ fusion / dp. Nobody waits and nothing is
	// padded there; MaxCost / IdealCost ≥ 1 is the step's total waste.
	IdealCost float64 `json:"ideal_cost"`
	// CostLowerBound is StepCostLowerBound of the step's entries: no split
	// of them into DP × MicroBatches micro-batches, padded or packed, has a
	// MaxCost below it.
	CostLowerBound float64 `json:"cost_lower_bound"`
	// RealTokens is Σ L over real entries; PaddedTokens is Σ over micro-batches
	// of entries × longest L (padding entries included).
	RealTokens   int64 `json:"real_tokens"`
	PaddedTokens int64 `json:"padded_tokens"`
	// Samples counts real entries, Padding zero-weight entries.
	Samples int `json:"samples"`
	Padding int `json:"padding"`
	// RealCost is Σ over real entries of their own (unpadded) cost total;
	// PaddedCost is Σ over all entries of the padded cost total (what the
	// trainer computes, PaddedFeatures).
	RealCost   float64 `json:"real_cost"`
	PaddedCost float64 `json:"padded_cost"`
}

// ComputeEfficiency returns RealCost / PaddedCost (1 when nothing is computed).
func (s StepStats) ComputeEfficiency() float64 {
	if s.PaddedCost <= 0 {
		return 1
	}
	return s.RealCost / s.PaddedCost
}

// PaddingEfficiency returns RealTokens / PaddedTokens (1 when nothing is padded).
func (s StepStats) PaddingEfficiency() float64 { return ratio(s.RealTokens, s.PaddedTokens) }

func ratio(real, padded int64) float64 {
	if padded == 0 {
		return 1
	}
	return float64(real) / float64(padded)
}

// Stats computes the statistics of every step of the plan.
func (p *Plan) Stats() []StepStats {
	out := make([]StepStats, len(p.Steps))
	m := p.Config.model()
	for k, s := range p.Steps {
		out[k] = p.stepStats(m, s)
	}
	return out
}

// stepAcc is what stepStats gathers over a step's micro-batches.
type stepAcc struct {
	entries []Cost      // every entry's cost
	slot    []float64   // per micro-batch position, the slowest rank's cost
	real    Cost        // Σ over real entries
	mbCost  [][]float64 // per rank, its micro-batches' step costs
	sum     float64     // Σ over ranks of their cost
}

func (p *Plan) stepStats(m CostModel, s Step) StepStats {
	st := StepStats{Step: s.Index, RankCost: make([]float64, len(s.Ranks))}
	acc := stepAcc{mbCost: make([][]float64, len(s.Ranks))}
	for r, rank := range s.Ranks {
		st.RankCost[r] = p.Config.Placement.StepCost(p.rankStats(m, rank, r, &st, &acc))
		st.MaxCost = max(st.MaxCost, st.RankCost[r])
		acc.sum += st.RankCost[r]
	}
	p.stepCosts(&st, &acc, len(s.Ranks))
	p.stepBounds(m, &st, &acc, len(s.Ranks))
	return st
}

// rankStats adds rank r's micro-batches to st and acc and returns the
// rank's cost (its micro-batches' sum).
func (p *Plan) rankStats(m CostModel, rank []MicroBatch, r int, st *StepStats, acc *stepAcc) Cost {
	pl, pack := p.Config.Placement, p.Config.Pack
	var c Cost
	for j, mb := range rank {
		longest, sumL := p.entryStats(m, mb, st, acc)
		if pack {
			st.PaddedTokens += int64(sumL)
		} else {
			st.PaddedTokens += int64(len(mb)) * int64(longest)
		}
		mc := m.MicroBatchCost(p.MicroBatchFeatures(mb), pack)
		st.PaddedCost += mc.Total()
		c = c.Add(mc)
		if j == len(acc.slot) {
			acc.slot = append(acc.slot, 0)
		}
		acc.slot[j] = max(acc.slot[j], pl.StepCost(mc))
		acc.mbCost[r] = append(acc.mbCost[r], pl.StepCost(mc))
	}
	return c
}

// entryStats adds the entries of micro-batch mb to st and acc and returns
// its longest caption and the sum of its caption lengths.
func (p *Plan) entryStats(m CostModel, mb MicroBatch, st *StepStats, acc *stepAcc) (longest, sumL int) {
	for _, e := range mb {
		it := p.items[e.Item]
		ec := m.Cost(it)
		acc.entries = append(acc.entries, ec)
		longest = max(longest, it.TextTokens)
		sumL += it.TextTokens
		if e.Weight > 0 {
			st.RealCost += ec.Total()
			acc.real = acc.real.Add(ec)
			st.RealTokens += int64(it.TextTokens)
			st.Samples++
		} else {
			st.Padding++
		}
	}
	return longest, sumL
}

// stepCosts sets the step's cost (MaxCost, under micro-batch sync and
// pipelining), the ranks' mean and the ideal cost of a step of dp ranks.
func (p *Plan) stepCosts(st *StepStats, acc *stepAcc, dp int) {
	if p.Config.Sync == SyncMicroBatch {
		var synced float64
		for _, c := range acc.slot {
			synced += c
		}
		st.MaxCost = max(st.MaxCost, synced)
	}
	pp := max(p.Config.PP, 1)
	if pp > 1 { // pipelined: a replica's step is its micro-batches' flow through pp stages
		acc.sum = 0
		for r, mbs := range acc.mbCost {
			st.RankCost[r] = PipelineRankCost(mbs, pp)
			acc.sum += st.RankCost[r]
		}
		st.MaxCost = PipelineStepCost(acc.mbCost, pp, p.Config.Sync)
	}
	if dp > 0 { // pp stages share a replica's work
		st.MeanCost = acc.sum / float64(dp)
		rc := acc.real
		st.IdealCost = (p.Config.Placement.StepCost(Cost{Vision: rc.Vision, Text: rc.Text}) + rc.Fusion) / float64(dp) / float64(pp)
	}
}

// stepBounds sets the step's cost lower bound and its imbalance with the
// imbalance's lower bound.
func (p *Plan) stepBounds(m CostModel, st *StepStats, acc *stepAcc, dp int) {
	pl, pack, pp := p.Config.Placement, p.Config.Pack, max(p.Config.PP, 1)
	var overhead Cost
	if pack {
		overhead = m.MicroBatchOverhead
	}
	st.CostLowerBound = StepCostLowerBound(acc.entries, dp, len(acc.slot), pl, p.Config.Sync, overhead)
	var maxEntry float64 // the costliest micro-batch costs at least this (pipeline bounds)
	if pp > 1 {
		for _, e := range acc.entries {
			maxEntry = max(maxEntry, pl.StepCost(e.Add(overhead)))
		}
		st.CostLowerBound = pipelineLowerBound(st.CostLowerBound, maxEntry, len(acc.slot), pp, p.Config.Sync)
	}
	st.Imbalance, st.ImbalanceLowerBound = 1, 1
	if st.MeanCost > 0 {
		st.Imbalance = st.MaxCost / st.MeanCost
		lb := pipelineLowerBound(RankCostLowerBound(acc.entries, dp, pl), maxEntry, len(acc.slot), pp, SyncStep)
		if pack {
			lb = st.CostLowerBound // the mean is the split's own: a bound on Imbalance
		}
		st.ImbalanceLowerBound = max(1, lb/st.MeanCost)
	}
}

// ImbalanceTarget is the per-step imbalance the quality target asks of p99
// (docs/cost-model.md); Summary counts the steps whose lower bound exceeds it.
const ImbalanceTarget = 1.03

// Summary aggregates a plan's step statistics.
type Summary struct {
	Steps          int     `json:"steps"`
	Samples        int     `json:"samples"`
	PaddingEntries int     `json:"padding_entries"`
	ImbalanceP50   float64 `json:"imbalance_p50"`
	ImbalanceP99   float64 `json:"imbalance_p99"`
	ImbalanceMax   float64 `json:"imbalance_max"`
	ImbalanceMean  float64 `json:"imbalance_mean"`
	// ImbalanceLowerBoundP99 and ImbalanceLowerBoundMax summarise the steps'
	// ImbalanceLowerBound: the imbalance p99 no partition of the planned
	// steps' samples could beat is at least the former.
	ImbalanceLowerBoundP99 float64 `json:"imbalance_lower_bound_p99"`
	ImbalanceLowerBoundMax float64 `json:"imbalance_lower_bound_max"`
	// StepsBoundAboveTarget counts steps whose ImbalanceLowerBound exceeds
	// ImbalanceTarget: steps that no partitioner could bring within it.
	StepsBoundAboveTarget int `json:"steps_bound_above_target"`
	// PaddingEfficiency is real / padded text tokens.
	PaddingEfficiency float64 `json:"padding_efficiency"`
	// ComputeEfficiency is Σ real (unpadded) cost / Σ padded cost: the share
	// of the trainer's compute spent on real tokens and patches.
	ComputeEfficiency float64 `json:"compute_efficiency"`
	// StepCostSum is Σ over steps of the max (padded) rank cost: the
	// predicted epoch time in the cost model's unit.
	StepCostSum float64 `json:"step_cost_sum"`
	// EpochEfficiency is Σ over steps of IdealCost over StepCostSum: 1.0 is
	// the physical limit, where every rank does only real work and nobody
	// waits.
	EpochEfficiency float64 `json:"epoch_efficiency"`
	// CostLowerBoundSum is Σ over steps of CostLowerBound: no split of the
	// planned steps' samples has a smaller StepCostSum, so
	// EpochEfficiencyBound = Σ IdealCost / CostLowerBoundSum bounds
	// EpochEfficiency from above, and StepCostSum / CostLowerBoundSum is how
	// far the plan is from the best any partitioner could do.
	CostLowerBoundSum    float64 `json:"cost_lower_bound_sum"`
	EpochEfficiencyBound float64 `json:"epoch_efficiency_bound"`
	// WindowBoundSum is Plan.WindowLowerBoundSum: no choice of the steps'
	// samples within their lookahead windows has a smaller StepCostSum, and
	// EpochEfficiencyWindowBound = Σ IdealCost / WindowBoundSum. Only for
	// the mmfeed strategy (0 otherwise, and for pipelined plans).
	WindowBoundSum             float64 `json:"window_bound_sum,omitempty"`
	EpochEfficiencyWindowBound float64 `json:"epoch_efficiency_window_bound,omitempty"`
	// CostOverBoundP99 is the p99 over steps of MaxCost / CostLowerBound:
	// how far the partitioner stays from the best split of each step.
	CostOverBoundP99 float64 `json:"cost_over_bound_p99"`
	MaxDelay         int     `json:"max_delay"`
	MinDelay         int     `json:"min_delay"`
}

// Summarize aggregates step statistics.
func Summarize(stats []StepStats) Summary {
	s := Summary{Steps: len(stats)}
	imb := make([]float64, len(stats))
	lb := make([]float64, len(stats))
	gap := make([]float64, len(stats))
	var real, padded int64
	var realC, paddedC, ideal float64
	for k, st := range stats {
		ideal += st.IdealCost
		s.CostLowerBoundSum += st.CostLowerBound
		realC += st.RealCost
		paddedC += st.PaddedCost
		imb[k] = st.Imbalance
		lb[k] = st.ImbalanceLowerBound
		gap[k] = 1
		if st.CostLowerBound > 0 {
			gap[k] = st.MaxCost / st.CostLowerBound
		}
		if st.ImbalanceLowerBound > ImbalanceTarget {
			s.StepsBoundAboveTarget++
		}
		s.StepCostSum += st.MaxCost
		s.ImbalanceMean += st.Imbalance
		s.Samples += st.Samples
		s.PaddingEntries += st.Padding
		real += st.RealTokens
		padded += st.PaddedTokens
	}
	s.PaddingEfficiency = ratio(real, padded)
	s.EpochEfficiency, s.EpochEfficiencyBound = 1, 1
	if s.StepCostSum > 0 {
		s.EpochEfficiency = ideal / s.StepCostSum
	}
	if s.CostLowerBoundSum > 0 {
		s.EpochEfficiencyBound = min(1, ideal/s.CostLowerBoundSum)
	}
	s.ComputeEfficiency = 1
	if paddedC > 0 {
		s.ComputeEfficiency = realC / paddedC
	}
	if len(imb) == 0 {
		return s
	}
	s.ImbalanceMean /= float64(len(imb))
	slices.Sort(imb)
	s.ImbalanceP50 = percentile(imb, 0.50)
	s.ImbalanceP99 = percentile(imb, 0.99)
	s.ImbalanceMax = imb[len(imb)-1]
	slices.Sort(gap)
	s.CostOverBoundP99 = percentile(gap, 0.99)
	slices.Sort(lb)
	s.ImbalanceLowerBoundP99 = percentile(lb, 0.99)
	s.ImbalanceLowerBoundMax = lb[len(lb)-1]
	return s
}

// percentile returns the nearest-rank q-quantile of sorted values.
func percentile(sorted []float64, q float64) float64 {
	k := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}
