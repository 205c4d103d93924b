package balancer

import (
	"cmp"
	"slices"
)

// RankCostLowerBound returns a lower bound on the largest rank cost of any
// split of a step's entries (costs, padding entries included) over dp ranks,
// under placement pl:
//
//   - the mean, Σ/dp (colocated; under modality placement the mean of the
//     additive parts vision + fusion and text + fusion, which bound the step
//     cost of any set of samples from below);
//   - for j ≥ 0, some rank holds j+1 of the j·dp+1 costliest entries
//     (pigeonhole), so it costs at least the j+1 cheapest of them.
//
// j = 0 is the costliest entry; j = 1 says the dp-th and (dp+1)-th costliest
// entries share a rank, the bound that bites when a few samples each cost
// about a rank's share. When
// the bound exceeds the step's mean rank cost, no partition of this step's
// samples reaches imbalance 1; only the lookahead window, which chooses the
// step's samples, can do better.
func RankCostLowerBound(costs []Cost, dp int, pl Placement) float64 {
	if dp < 1 || len(costs) == 0 {
		return 0
	}
	var lb float64
	s := make([]float64, len(costs))
	for _, part := range costParts(pl) {
		lb = max(lb, rankBound(s, partValues(s, costs, part), dp))
	}
	return lb
}

// costParts are the additive parts of a rank's cost under placement pl: the
// total, or under modality placement vision + fusion and text + fusion.
func costParts(pl Placement) []func(Cost) float64 {
	if pl == Modality {
		return []func(Cost) float64{
			func(c Cost) float64 { return c.Vision + c.Fusion },
			func(c Cost) float64 { return c.Text + c.Fusion },
		}
	}
	return []func(Cost) float64{Cost.Total}
}

// partValues sets s to part of each cost, sorted costliest first, and
// returns their sum.
func partValues(s []float64, costs []Cost, part func(Cost) float64) float64 {
	var sum float64
	for i, c := range costs {
		s[i] = part(c)
		sum += s[i]
	}
	slices.SortFunc(s, func(a, b float64) int { return cmp.Compare(b, a) })
	return sum
}

// rankBound is the bound on the costliest rank for one part: sum / dp and
// the pigeonhole sums over s (sorted costliest first).
func rankBound(s []float64, sum float64, dp int) float64 {
	b := sum / float64(dp)
	for j := 0; j*dp < len(s); j++ {
		var t float64
		for _, c := range s[j*dp-j : j*dp+1] { // the j+1 cheapest of the top j·dp+1
			t += c
		}
		b = max(b, t)
	}
	return b
}

// StepCostLowerBound returns a lower bound on the step cost (StepStats.MaxCost)
// of any split of a step's entries (their own, unpadded costs) over dp ranks
// × m micro-batches under placement pl and sync, for padded and packed plans
// alike (padding never lowers a micro-batch's cost below its samples' sum).
// overhead is what every micro-batch costs on top of its samples (a packed
// plan's CostModel.MicroBatchOverhead; zero for padded plans).
//
// For every additive part f of the step cost (the total, or under modality
// placement vision + fusion and text + fusion) it takes the largest of:
//
//   - RankCostLowerBound's bounds on the costliest rank: Σf / dp and the
//     pigeonhole sums;
//   - with SyncMicroBatch, the position holding the costliest entry costs at
//     least that entry, and each of the other m − 1 positions holds dp
//     entries (every micro-batch is non-empty) of which its costliest costs
//     at least the (i·dp)-th cheapest of the rest: f₁ + Σ_{i<m} f_(i·dp).
//
// plus m × f(overhead). The second term is what says that one sample worth
// many fair micro-batch shares makes a step unbalanceable with small
// micro-batches.
func StepCostLowerBound(costs []Cost, dp, m int, pl Placement, sync Sync, overhead Cost) float64 {
	if dp < 1 || m < 1 || len(costs) == 0 {
		return 0
	}
	var lb float64
	s := make([]float64, len(costs))
	for _, part := range costParts(pl) {
		b := rankBound(s, partValues(s, costs, part), dp)
		if sync == SyncMicroBatch && m > 1 && len(s) > (m-1)*dp {
			t := s[0]
			rest := s[1:] // descending; the (i·dp)-th cheapest is rest[len−i·dp]
			for i := 1; i < m; i++ {
				t += rest[len(rest)-i*dp]
			}
			b = max(b, t)
		}
		lb = max(lb, b+float64(m)*part(overhead))
	}
	return lb
}
