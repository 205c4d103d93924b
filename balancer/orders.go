package balancer

import (
	"math"
	"math/bits"
	"slices"
)

// The padded generators cut the items in three sorted orders: by cost, by
// (L, cost) and by (P, L, cost), ties by position. One radix sort ranks the
// items by (cost, position); the other two orders then radix-sort packed
// integer keys (field << shift | cost rank), which is several times faster
// than sorting structs with a comparator and gives the same order.

// costOrder returns the positions sorted by (key[pos], pos).
func costOrder(key []float64) []int32 {
	k := make([]uint64, len(key))
	out := make([]int32, len(key))
	for i, c := range key {
		k[i], out[i] = orderedBits(c), int32(i)
	}
	radixSort(k, out)
	return out
}

// radixSort sorts keys ascending, carrying vals (nil: none) along: a stable
// LSD radix sort, passes of 11 bits (skipping a digit every key shares), so
// equal keys keep their order and nothing is compared. The digits' counts
// do not depend on the order, so one pass over the keys counts them all.
func radixSort(keys []uint64, vals []int32) {
	n := len(keys)
	if n < 2 || slices.IsSorted(keys) {
		return // a stable sort leaves sorted keys as they are (positionsFirst's chunks come in one order already)
	}
	k, k2 := keys, make([]uint64, n)
	var v, v2 []int32
	if vals != nil {
		v, v2 = vals, make([]int32, n)
	}
	const (
		digit  = 11 // bits per pass, 2,048 counters
		mask   = 1<<digit - 1
		digits = 6 // ⌈64 / digit⌉, counted unrolled below
	)
	var counts [digits][1 << digit]int32
	for _, x := range k {
		counts[0][x&mask]++
		counts[1][x>>digit&mask]++
		counts[2][x>>(2*digit)&mask]++
		counts[3][x>>(3*digit)&mask]++
		counts[4][x>>(4*digit)&mask]++
		counts[5][x>>(5*digit)&mask]++
	}
	for d := range digits {
		shift, count := d*digit, &counts[d]
		if int(count[k[0]>>shift&mask]) == n {
			continue // every key has this digit
		}
		var sum int32
		for i, c := range count {
			count[i], sum = sum, sum+c
		}
		for i, x := range k {
			b := x >> shift & mask
			k2[count[b]] = x
			if v != nil {
				v2[count[b]] = v[i]
			}
			count[b]++
		}
		k, k2, v, v2 = k2, k, v2, v
	}
	if &k[0] != &keys[0] { // an odd number of passes: the result is in the spare
		copy(keys, k)
		copy(vals, v)
	}
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

// itemField selects a token count of an item as a sort key (rankKeys.sorted).
type itemField int8

const (
	noField    itemField = iota // 0 for every item
	textField                   // Item.TextTokens
	imageField                  // Item.ImageTokens
)

func (f itemField) of(it *Item) int {
	switch f {
	case textField:
		return it.TextTokens
	case imageField:
		return it.ImageTokens
	}
	return 0
}

// sorted returns the positions of items sorted by (major, minor, cost rank):
// it radix-sorts keys major << (mb + rb) | minor << rb | rank, with as many
// bits per field as its largest value needs (fewer bits, fewer passes). Nil
// when the keys do not fit in 64 bits.
func (rk rankKeys) sorted(items []Item, major, minor itemField) []int32 {
	n := len(rk.rank)
	var hiA, hiB int
	for pos := range items {
		a, b := major.of(&items[pos]), minor.of(&items[pos])
		if a < 0 || b < 0 {
			return nil
		}
		hiA, hiB = max(hiA, a), max(hiB, b)
	}
	rb, mb := bits.Len(uint(n)), bits.Len(uint(hiB))
	if rb+mb+bits.Len(uint(hiA)) > 64 {
		return nil
	}
	keys := make([]uint64, n)
	for pos := range items {
		keys[pos] = uint64(major.of(&items[pos]))<<(mb+rb) | uint64(minor.of(&items[pos]))<<rb | uint64(rk.rank[pos])
	}
	radixSort(keys, nil)
	out := make([]int32, n)
	for i, k := range keys {
		out[i] = rk.byCost[k&(1<<rb-1)]
	}
	return out
}
