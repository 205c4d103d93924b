package balancer

import (
	"cmp"
	"fmt"
	"slices"
)

// baselineStep splits one global batch the way the baseline samplers do. The
// step is first filled with zero-weight copies of the epoch's first samples
// (DistributedSampler's padding) up to a multiple of DP, at least DP ×
// MicroBatches, and for the padded tail up to GlobalBatch.
func (b *builder) baselineStep(bt batch, first []int32) error {
	dp, mbs := b.cfg.DP, b.cfg.MicroBatches
	ids := slices.Clone(bt.items)
	real := len(ids)
	want := max(real, dp*mbs)
	if bt.pad && b.cfg.GlobalBatch > 0 {
		want = max(want, b.cfg.GlobalBatch)
	}
	want = (want + dp - 1) / dp * dp
	if len(first) == 0 {
		return fmt.Errorf("balancer: step %d: %w", bt.arrival, ErrTooFewItems)
	}
	for k := 0; len(ids) < want; k++ {
		ids = append(ids, first[k%len(first)])
	}
	perRank := len(ids) / dp
	a := Assignment{DP: dp, MicroBatches: mbs, Members: make([][]int32, dp*mbs)}
	switch b.cfg.Strategy {
	case StrategyRandom:
		for r := range dp {
			rank := make([]int32, 0, perRank)
			for k := r; k < len(ids); k += dp {
				rank = append(rank, int32(k))
			}
			for m, sz := 0, 0; m < mbs; m, rank = m+1, rank[sz:] {
				sz = chunk(perRank, mbs, m)
				a.Members[r*mbs+m] = rank[:sz:sz]
			}
		}
	case StrategyLengthGrouped:
		pos := make([]int32, len(ids))
		for k := range pos {
			pos[k] = int32(k)
		}
		for m, rest := 0, pos; m < mbs; m++ {
			sz := chunk(perRank, mbs, m)
			mega := rest[:sz*dp]
			rest = rest[sz*dp:]
			slices.SortStableFunc(mega, func(x, y int32) int {
				return cmp.Compare(b.items[ids[y]].TextTokens, b.items[ids[x]].TextTokens)
			})
			for r := range dp {
				a.Members[r*mbs+m] = mega[r*sz : (r+1)*sz : (r+1)*sz]
			}
		}
	}
	b.plan.Steps = append(b.plan.Steps, b.toStep(bt.arrival, a, func(p int32) Entry {
		if int(p) >= real {
			return Entry{Item: ids[p]}
		}
		return Entry{Item: ids[p], Weight: 1}
	}))
	return nil
}

// chunk returns the size of part m when n is split into k parts that differ by
// at most one, larger parts first.
func chunk(n, k, m int) int {
	if m < n%k {
		return n/k + 1
	}
	return n / k
}
