package balancer

import (
	"slices"
)

// Pipeline parallelism (Config.PP > 1): the trainer splits each tower's
// blocks over PP stages and runs a rank's micro-batches through them with a
// GPipe or 1F1B schedule. With the stages even, micro-batch j of cost c_j
// (the whole model's, as everywhere in this package) takes c_j / PP on every
// stage, and the stages form a proportionate flow shop, whose makespan is
// exactly Σ_j c_j/PP + (PP − 1) · max_j c_j/PP for the forward passes and
// again for the backward ones (1F1B has GPipe's bubble, only less memory in
// flight). So a dp replica's step costs
//
//	T = (Σ_j c_j + (PP − 1) · max_j c_j) / PP
//
// in the package's cost unit: the sum a rank would pay without pipelining,
// divided by PP, plus a bubble driven by the rank's costliest micro-batch.
// One long micro-batch stalls every stage once on the way in and once on the
// way out, so the planner levels micro-batches within each rank as well as
// across ranks. With SyncMicroBatch the last stages of the dp replicas meet at
// every micro-batch (the contrastive all-gather), so the sum runs over
// positions of the slowest replica's micro-batch there and the bubble over the
// step's costliest micro-batch. docs/cost-model.md, "Pipeline parallelism".

// MaxPP bounds Config.PP.
const MaxPP = 1024

// pp returns the pipeline degree, 1 when unset.
func (c PartitionConfig) pp() int { return max(c.PP, 1) }

// PipelineRankCost returns one dp replica's step cost under pp stages for its
// micro-batch costs mb: (Σ mb + (pp − 1) · max mb) / pp; Σ mb when pp ≤ 1.
func PipelineRankCost(mb []float64, pp int) float64 {
	pp = max(pp, 1)
	var sum, hi float64
	for _, c := range mb {
		sum += c
		hi = max(hi, c)
	}
	return (sum + float64(pp-1)*hi) / float64(pp)
}

// PipelineStepCost returns the step cost of slots[r][j], the cost of dp rank
// r's micro-batch at position j, under pp stages: the largest
// PipelineRankCost, and with SyncMicroBatch at least (Σ over positions of
// the largest cost there + (pp − 1) · the largest cost) / pp. With pp ≤ 1 it
// is the step cost of Stats (slowest rank total, or with SyncMicroBatch the
// sum of position maxima when larger).
func PipelineStepCost(slots [][]float64, pp int, sync Sync) float64 {
	pp = max(pp, 1)
	var worst float64
	var top []float64
	for _, mb := range slots {
		worst = max(worst, PipelineRankCost(mb, pp))
		for j, c := range mb {
			if j == len(top) {
				top = append(top, 0)
			}
			top[j] = max(top[j], c)
		}
	}
	if sync == SyncMicroBatch {
		worst = max(worst, PipelineRankCost(top, pp))
	}
	return worst
}

// pipelineLowerBound turns lb, a lower bound of the unpipelined step cost
// (StepCostLowerBound), into one under pp stages with m micro-batches per
// rank, given the costliest single entry: the costliest micro-batch costs at
// least that entry and at least lb / m (with SyncStep lb bounds one rank's
// sum, which the same rank's bubble then follows).
func pipelineLowerBound(lb, maxEntry float64, m, pp int, sync Sync) float64 {
	if pp <= 1 {
		return lb
	}
	p := float64(pp)
	mean := lb / float64(max(m, 1))
	if sync == SyncMicroBatch {
		return (lb + (p-1)*max(maxEntry, mean)) / p
	}
	return max((lb+(p-1)*mean)/p, maxEntry)
}

// levelPipeline lowers the pipelined step cost of a (PartitionConfig.PP > 1)
// by moving single entries out of the step's costliest micro-batch into
// another one, of the same or another rank, while that lowers the cost and
// the budget holds; every micro-batch keeps at least one entry. It returns
// a with each rank's micro-batches costliest first again.
func (p *Partitioner) levelPipeline(a Assignment) Assignment {
	m := p.cfg.MicroBatches
	if p.cfg.pp() <= 1 || m == 1 || p.cfg.Refinement != RefineLocalSearch {
		return a
	}
	members := make([][]int32, len(a.Members))
	cost := make([]float64, len(a.Members))
	for k, mb := range a.Members {
		members[k] = slices.Clone(mb)
		cost[k] = p.mbCost(mb)
	}
	cur := p.pipelineCost(cost)
	for range 4 * len(members) {
		hi := 0
		for k, c := range cost {
			if c > cost[hi] {
				hi = k
			}
		}
		if len(members[hi]) < 2 {
			break
		}
		best, bestI, bestK := cur, -1, -1
		var bestFrom, bestTo float64
		for i, pos := range members[hi] {
			from := slices.Delete(slices.Clone(members[hi]), i, i+1)
			cFrom := p.mbCost(from)
			for k := range members {
				to := append(slices.Clone(members[k]), pos)
				if k == hi || !p.mbFits(to) {
					continue
				}
				cTo := p.mbCost(to)
				oldHi, oldK := cost[hi], cost[k]
				cost[hi], cost[k] = cFrom, cTo
				if c := p.pipelineCost(cost); c < best*(1-minGain) {
					best, bestI, bestK, bestFrom, bestTo = c, i, k, cFrom, cTo
				}
				cost[hi], cost[k] = oldHi, oldK
			}
		}
		if bestK < 0 {
			break
		}
		pos := members[hi][bestI]
		members[hi] = slices.Delete(members[hi], bestI, bestI+1)
		members[bestK] = append(members[bestK], pos)
		cost[hi], cost[bestK], cur = bestFrom, bestTo, best
	}
	return p.ordered(members, cost)
}

// ordered returns the assignment of members with each micro-batch longest
// text first and each rank's micro-batches costliest first.
func (p *Partitioner) ordered(members [][]int32, cost []float64) Assignment {
	m := p.cfg.MicroBatches
	for r := range p.cfg.DP {
		idx := make([]int, m)
		for j := range idx {
			idx[j] = r*m + j
		}
		slices.SortStableFunc(idx, func(x, y int) int {
			switch {
			case cost[x] > cost[y]:
				return -1
			case cost[x] < cost[y]:
				return 1
			}
			return 0
		})
		rank := make([][]int32, m)
		for j, k := range idx {
			rank[j] = members[k]
		}
		copy(members[r*m:(r+1)*m], rank)
	}
	for _, mb := range members {
		slices.SortStableFunc(mb, func(x, y int32) int { return p.items[y].TextTokens - p.items[x].TextTokens })
	}
	return Assignment{DP: p.cfg.DP, MicroBatches: m, Members: members}
}

// pipelineCost returns PipelineStepCost of the slot costs (rank r's
// micro-batches at cost[r*M:(r+1)*M]), each rank's run costliest first.
func (p *Partitioner) pipelineCost(cost []float64) float64 {
	m := p.cfg.MicroBatches
	slots := make([][]float64, p.cfg.DP)
	for r := range slots {
		slots[r] = slices.Clone(cost[r*m : (r+1)*m])
		slices.SortFunc(slots[r], func(x, y float64) int {
			switch {
			case x > y:
				return -1
			case x < y:
				return 1
			}
			return 0
		})
	}
	return PipelineStepCost(slots, p.cfg.pp(), p.cfg.Sync)
}

// mbCost returns the step cost (under the placement) of the micro-batch of
// positions mb, padded or packed as configured.
func (p *Partitioner) mbCost(mb []int32) float64 {
	var f Features
	if p.cfg.Pack {
		for _, pos := range mb {
			it := p.items[pos]
			f = f.Add(FeaturesOf(it.TextTokens, it.ImageTokens, it.Complexity))
		}
	} else {
		var s mbShape
		for _, pos := range mb {
			s.add(p.items[pos])
		}
		f = s.features()
	}
	return p.cfg.Placement.StepCost(p.model.MicroBatchCost(f, p.cfg.Pack))
}

// mbFits reports whether the micro-batch of positions mb is within the budget.
func (p *Partitioner) mbFits(mb []int32) bool {
	var s mbShape
	sumL := 0
	for _, pos := range mb {
		s.add(p.items[pos])
		sumL += p.items[pos].TextTokens
	}
	if p.cfg.Pack {
		return p.cfg.Budget.FitsPacked(s.count, sumL, s.sumP)
	}
	return p.cfg.Budget.Fits(s.count, s.maxL, s.sumP)
}
