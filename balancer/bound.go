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
	parts := []func(Cost) float64{Cost.Total}
	if pl == Modality {
		parts = []func(Cost) float64{
			func(c Cost) float64 { return c.Vision + c.Fusion },
			func(c Cost) float64 { return c.Text + c.Fusion },
		}
	}
	var lb float64
	s := make([]float64, len(costs))
	for _, part := range parts {
		var sum float64
		for i, c := range costs {
			s[i] = part(c)
			sum += s[i]
		}
		lb = max(lb, sum/float64(dp))
		slices.SortFunc(s, func(a, b float64) int { return cmp.Compare(b, a) })
		for j := 0; j*dp < len(s); j++ {
			var b float64
			for _, c := range s[j*dp-j : j*dp+1] { // the j+1 cheapest of the top j·dp+1
				b += c
			}
			lb = max(lb, b)
		}
	}
	return lb
}
