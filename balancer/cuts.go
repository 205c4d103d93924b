package balancer

import (
	"cmp"
	"fmt"
	"slices"
)

// sortByLength returns the positions sorted by (L, cost, position).
func (jb *job) sortByLength() []int32 {
	if out := jb.ranked.sorted(jb.items, textField, noField); out != nil {
		return out
	}
	return jb.sortBy(func(it Item) (int, int) { return it.TextTokens, 0 })
}

// sortBy returns the positions sorted by (key(item), cost, position), by
// comparison (the fallback of rankKeys.sorted).
func (jb *job) sortBy(key func(Item) (int, int)) []int32 {
	type keyed struct {
		a, b int
		rank int32
	}
	ks := make([]keyed, len(jb.items))
	for i, it := range jb.items {
		a, b := key(it)
		ks[i] = keyed{a, b, jb.ranked.rank[i]}
	}
	slices.SortFunc(ks, func(x, y keyed) int {
		return cmp.Or(cmp.Compare(x.a, y.a), cmp.Compare(x.b, y.b), cmp.Compare(x.rank, y.rank))
	})
	order := make([]int32, len(ks))
	for i, k := range ks {
		order[i] = jb.ranked.byCost[k.rank]
	}
	return order
}

// computeNeed returns need, need[i] the minimal number of budget-feasible
// contiguous micro-batches for order[i:], by greedy packing from the right
// (optimal because a sub-interval of a feasible micro-batch is feasible).
func (jb *job) computeNeed(order []int32) []int32 {
	n := len(order)
	need := make([]int32, n+1)
	g, count, maxL, sumP := int32(0), 0, 0, 0
	for i := n - 1; i >= 0; i-- {
		it := &jb.items[order[i]]
		if count > 0 && !jb.cfg.Budget.Fits(count+1, maxL, sumP+it.ImageTokens) {
			count = 0
		}
		if count == 0 {
			g++
			maxL, sumP = it.TextTokens, 0
		}
		count++
		sumP += it.ImageTokens
		need[i] = g
	}
	return need
}

// initialCuts checks that the budget can hold the items in DP × MicroBatches
// micro-batches (need from computeNeed) and returns the first grouping of the
// length-sorted order:
// padding-optimal contiguous groups (by dynamic programming) when the batch is
// small enough, else contiguous groups of about equal cost.
func (jb *job) initialCuts(byLength, need []int32) ([]int, error) {
	k := jb.cfg.DP * jb.cfg.MicroBatches
	n := len(byLength)
	if int(need[0]) > k {
		return nil, fmt.Errorf("balancer: %d items need at least %d micro-batches under budget %+v, have %d: %w",
			n, need[0], jb.cfg.Budget, k, ErrBudgetExceeded)
	}
	if k*n <= jb.dpLimit {
		if c := jb.newCutter(byLength).cuts(k, 0, 0); c != nil {
			return c, nil
		}
	}
	return jb.equalCostCuts(byLength, need, k), nil
}

// validCuts reports whether cuts are strictly increasing from 0 to n.
func validCuts(cuts []int, n int) bool {
	if len(cuts) < 2 || cuts[0] != 0 || cuts[len(cuts)-1] != n {
		return false
	}
	for i := 1; i < len(cuts); i++ {
		if cuts[i] <= cuts[i-1] {
			return false
		}
	}
	return true
}

// equalCostCuts cuts the length-sorted order into k contiguous groups of about
// equal cost. Using need it never closes a group so early that the rest cannot
// fit in the remaining groups, and never extends one beyond the budget unless
// that is forced (then the budget holds by construction).
func (jb *job) equalCostCuts(order, need []int32, k int) []int {
	n := len(order)
	var remaining float64
	for _, pos := range order {
		remaining += jb.costs[pos].Total()
	}
	cuts := make([]int, k+1)
	pos := 0
	for g := range k {
		target := remaining / float64(k-g)
		acc, count, maxL, sumP := 0.0, 0, 0, 0
		for pos < n-(k-1-g) {
			it := &jb.items[order[pos]]
			c := jb.costs[order[pos]].Total()
			if count > 0 && int(need[pos]) <= k-1-g {
				if g < k-1 && acc+c/2 > target {
					break
				}
				if !jb.cfg.Budget.Fits(count+1, max(maxL, it.TextTokens), sumP+it.ImageTokens) {
					break
				}
			}
			acc += c
			count++
			maxL = max(maxL, it.TextTokens)
			sumP += it.ImageTokens
			pos++
		}
		remaining -= acc
		cuts[g+1] = pos
	}
	return cuts
}
