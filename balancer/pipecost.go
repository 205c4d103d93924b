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

// ordered returns the assignment of members with each micro-batch longest
// text first and each rank's micro-batches costliest first.
func (jb *job) ordered(members [][]int32, cost []float64) Assignment {
	m := jb.cfg.MicroBatches
	for r := range jb.cfg.DP {
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
		slices.SortStableFunc(mb, func(x, y int32) int { return jb.items[y].TextTokens - jb.items[x].TextTokens })
	}
	return Assignment{DP: jb.cfg.DP, MicroBatches: m, Members: members}
}
