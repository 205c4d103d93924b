package loader

import "math/bits"

// Epoch order
//
// Permutation(n, seed, epoch) is a Fisher–Yates shuffle driven by SplitMix64,
// specified exactly so other languages can reproduce it:
//
//	const GOLDEN = 0x9E3779B97F4A7C15
//	mix(z):  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
//	         z = (z ^ (z >> 27)) * 0x94D049BB133111EB
//	         return z ^ (z >> 31)
//	state = mix(seed ^ mix(epoch + GOLDEN))        // all arithmetic mod 2^64
//	next(): state += GOLDEN; return mix(state)      // SplitMix64
//	perm = [0, 1, ..., n-1]
//	for i = n-1 down to 1:
//	    j = (next() * (i+1)) >> 64                  // high 64 bits of the 128-bit product
//	    swap perm[i], perm[j]
//
// The multiply-shift bound has a bias below (i+1)/2^64, irrelevant for
// shuffling. In Python: j = (nxt() * (i + 1)) >> 64 with masking to 64 bits
// after every addition and multiplication inside mix and next.

const golden = 0x9E3779B97F4A7C15

// mix64 is the SplitMix64 output function.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// SplitMix64 is the generator behind Permutation. The zero value is a valid
// generator seeded with 0.
type SplitMix64 struct{ state uint64 }

// NewEpochRand returns the generator Permutation uses for (seed, epoch).
func NewEpochRand(seed, epoch uint64) *SplitMix64 {
	return &SplitMix64{state: mix64(seed ^ mix64(epoch+golden))}
}

// Uint64 returns the next value.
func (r *SplitMix64) Uint64() uint64 {
	r.state += golden
	return mix64(r.state)
}

// Below returns a value in [0, n) by multiply-shift; n must be > 0.
func (r *SplitMix64) Below(n uint64) uint64 {
	hi, _ := bits.Mul64(r.Uint64(), n)
	return hi
}

// Permutation returns the epoch order of n samples: a permutation of
// [0, n) that is a pure function of (n, seed, epoch). n <= 0 gives an empty
// slice.
func Permutation(n int, seed, epoch uint64) []int {
	if n <= 0 {
		return []int{}
	}
	perm := make([]int, n)
	for i := range perm {
		perm[i] = i
	}
	r := NewEpochRand(seed, epoch)
	for i := n - 1; i > 0; i-- {
		j := int(r.Below(uint64(i + 1)))
		perm[i], perm[j] = perm[j], perm[i]
	}
	return perm
}

// Order returns the entries of ix in the epoch order of (seed, epoch).
// The slice is new; the entries share their strings with ix (a packed index
// materialises them, re-reading each record).
func (ix *Index) Order(seed, epoch uint64) []Entry {
	perm := Permutation(ix.Len(), seed, epoch)
	out := make([]Entry, len(perm))
	for i, p := range perm {
		out[i] = ix.Entry(p)
	}
	return out
}
