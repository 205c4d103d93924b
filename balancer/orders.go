package balancer

import (
	"math"
	"slices"
)

// The padded generators cut the items in three sorted orders: by cost, by
// (L, cost) and by (P, L, cost), ties by position. One radix sort ranks the
// items by (cost, position); the other two orders then sort packed integer
// keys (field << shift | cost rank), which is several times faster than
// sorting structs with a comparator and gives the same order.

// costOrder returns the positions sorted by (key[pos], pos): a stable LSD
// radix sort of the keys' ordered bits (8 passes of 8 bits; stable, so
// equal keys keep position order), without comparisons.
func costOrder(key []float64) []int32 {
	n := len(key)
	k, k2 := make([]uint64, n), make([]uint64, n)
	out, out2 := make([]int32, n), make([]int32, n)
	for i, c := range key {
		k[i], out[i] = orderedBits(c), int32(i)
	}
	var count [256]int
	for shift := 0; shift < 64 && n > 0; shift += 8 {
		clear(count[:])
		for _, v := range k {
			count[byte(v>>shift)]++
		}
		if count[byte(k[0]>>shift)] == n {
			continue // every key has this digit
		}
		sum := 0
		for d, c := range count {
			count[d], sum = sum, sum+c
		}
		for i, v := range k {
			d := byte(v >> shift)
			k2[count[d]], out2[count[d]] = v, out[i]
			count[d]++
		}
		k, k2, out, out2 = k2, k, out2, out
	}
	return out
}

// orderedBits maps a float64 to a uint64 of the same order (−0 as +0; no
// NaN among costs).
func orderedBits(f float64) uint64 {
	if f == 0 {
		f = 0 // −0 sorts with +0, as cmp.Compare has it
	}
	b := math.Float64bits(f)
	if b>>63 == 1 {
		return ^b
	}
	return b | 1<<63
}

// rankKeys holds the items' cost ranks for the packed sort keys.
type rankKeys struct {
	byCost []int32 // positions by (cost, position)
	rank   []int32 // rank[pos]: pos's index in byCost
}

func newRankKeys(key []float64) rankKeys {
	byCost := costOrder(key)
	rank := make([]int32, len(byCost))
	for i, pos := range byCost {
		rank[pos] = int32(i)
	}
	return rankKeys{byCost, rank}
}

// sorted returns the positions sorted by (major(pos), minor(pos), cost rank):
// major and minor are token counts (at most MaxItemTokens = 2²⁰, 21 bits).
// Nil when the keys do not fit in 64 bits (more than 2²² items, or token
// counts outside [0, 2²¹)).
func (rk rankKeys) sorted(major, minor func(pos int) int) []int32 {
	n := len(rk.rank)
	if n > 1<<22 {
		return nil
	}
	keys := make([]uint64, n)
	for pos := range n {
		a, b := major(pos), minor(pos)
		if a < 0 || a >= 1<<21 || b < 0 || b >= 1<<21 {
			return nil
		}
		keys[pos] = uint64(a)<<43 | uint64(b)<<22 | uint64(rk.rank[pos])
	}
	slices.Sort(keys)
	out := make([]int32, n)
	for i, k := range keys {
		out[i] = rk.byCost[k&(1<<22-1)]
	}
	return out
}
