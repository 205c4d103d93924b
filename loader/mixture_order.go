package loader

import (
	"container/heap"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Mixture epochs
//
// An epoch of a mixture is a fixed number of draws (docs/mixtures.md):
//
//   - MixtureCounts gives each source's draws d_i: without Mixture.Draws,
//     d_i = round(n_h · w_i / w_h) where h is the heaviest-weighted source
//     (the first on ties) and n_h its samples, so d_h = n_h: the heaviest
//     source is taken once through; with Draws = D, the largest-remainder
//     split of D in proportion to the weights (ties to the earlier source).
//     A cap then lowers d_i to Cap. A source with d_i = 0 is an error.
//   - Within source i, draw k takes sample perm_{i,p}[k mod n_i] of pass
//     p = k div n_i, where perm_{i,p} = Permutation(n_i, seed_{i,p}, epoch)
//     and seed_{i,p} = mix(seed ^ mix(GOLDEN ^ (i<<32 | p))). A sample is
//     drawn at most once unless d_i > n_i; then pass p repeats it with
//     Repeat = p, and no sample is drawn p+1 times before every sample of
//     the source was drawn p times.
//   - The sources are interleaved by stride scheduling with seeded phases:
//     r = NewEpochRand(seed ^ 0x6d6978747572, epoch) gives source i the
//     phase u_i = (r.Uint64() >> 11) / 2^53 (in source order), and the k-th
//     draw of source i has the key (k + u_i) / d_i (float64); draws are
//     sorted by key, ties to the earlier source. Every prefix of the epoch
//     holds each source's share of its draws to within one draw.
//
// The order is a pure function of (the sources' sizes, the counts, seed,
// epoch): a resume at any position and an elastic resize continue it.

// Draw is one draw of a mixture epoch: sample Sample (an index into the
// source's own index) of source Source, its Repeat-th repetition (0: the
// first draw of the sample in the epoch).
type Draw struct {
	Source int32
	Sample int32
	Repeat int32
}

// MixtureCounts returns each source's draws in an epoch, given the sources'
// sizes (their good samples), in source order.
func MixtureCounts(m *Mixture, sizes []int) ([]int, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if len(sizes) != len(m.Sources) {
		return nil, fmt.Errorf("%w: %d sizes for %d sources", ErrInvalidMixture, len(sizes), len(m.Sources))
	}
	for i, n := range sizes {
		if n <= 0 {
			return nil, fmt.Errorf("%w: source %q has no samples", ErrInvalidMixture, m.Sources[i].Name)
		}
		if n > math.MaxInt32 {
			return nil, fmt.Errorf("%w: source %q has %d samples, more than %d", ErrInvalidMixture, m.Sources[i].Name, n, math.MaxInt32)
		}
	}
	var counts []int
	if m.Draws == 0 {
		counts = heaviestOnce(m, sizes)
	} else {
		counts = largestRemainder(m, m.Draws)
	}
	total := 0
	for i, s := range m.Sources {
		if s.Cap > 0 && counts[i] > s.Cap {
			counts[i] = s.Cap
		}
		if counts[i] == 0 {
			return nil, fmt.Errorf("%w: source %q gets no draw in an epoch: raise its weight or the draws", ErrInvalidMixture, s.Name)
		}
		total += counts[i]
	}
	if total == 0 || total > MaxMixtureDraws {
		return nil, fmt.Errorf("%w: %d draws per epoch, want 1 to %d (set draws, or caps)", ErrInvalidMixture, total, MaxMixtureDraws)
	}
	return counts, nil
}

// heaviestOnce is round(n_h · w_i / w_h) for the heaviest source h.
func heaviestOnce(m *Mixture, sizes []int) []int {
	h := 0
	for i, s := range m.Sources {
		if s.Weight > m.Sources[h].Weight {
			h = i
		}
	}
	out := make([]int, len(sizes))
	for i, s := range m.Sources {
		d := math.Round(float64(sizes[h]) * s.Weight / m.Sources[h].Weight)
		out[i] = int(min(d, MaxMixtureDraws+1))
	}
	out[h] = sizes[h]
	return out
}

// largestRemainder splits d in proportion to the weights.
func largestRemainder(m *Mixture, d int) []int {
	var sum float64
	for _, s := range m.Sources {
		sum += s.Weight
	}
	out := make([]int, len(m.Sources))
	frac := make([]float64, len(m.Sources))
	left := d
	for i, s := range m.Sources {
		q := float64(d) * s.Weight / sum
		out[i] = min(int(math.Floor(q)), left)
		frac[i] = q - float64(out[i])
		left -= out[i]
	}
	idx := make([]int, len(out))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case frac[a] > frac[b]:
			return -1
		case frac[a] < frac[b]:
			return 1
		}
		return 0
	})
	for k := 0; left > 0; k = (k + 1) % len(idx) {
		out[idx[k]]++
		left--
	}
	return out
}

// PassSeed is seed_{i,p}: the seed of pass p over source i.
func PassSeed(seed uint64, source, pass int) uint64 {
	return mix64(seed ^ mix64(golden^(uint64(source)<<32|uint64(pass))))
}

// MixtureOrder returns the draws of an epoch of sources with sizes and the
// draws counts (MixtureCounts), for (seed, epoch).
func MixtureOrder(sizes, counts []int, seed, epoch uint64) []Draw {
	total := 0
	for _, c := range counts {
		total += c
	}
	out := make([]Draw, 0, total)
	r := NewEpochRand(seed^0x6d6978747572, epoch)
	h := make(strideHeap, 0, len(counts))
	for i, c := range counts {
		u := float64(r.Uint64()>>11) / (1 << 53)
		if c > 0 {
			h = append(h, strideSource{i: i, d: c, u: u})
		}
	}
	for i := range h {
		h[i].key = h[i].u / float64(h[i].d)
	}
	heap.Init(&h)
	perms := make([][]int, len(counts))
	for len(h) > 0 {
		s := &h[0]
		n := sizes[s.i]
		pass, at := s.k/n, s.k%n
		if at == 0 {
			perms[s.i] = Permutation(n, PassSeed(seed, s.i, pass), epoch)
		}
		out = append(out, Draw{Source: int32(s.i), Sample: int32(perms[s.i][at]), Repeat: int32(pass)})
		s.k++
		if s.k == s.d {
			perms[s.i] = nil
			heap.Pop(&h)
			continue
		}
		s.key = (float64(s.k) + s.u) / float64(s.d)
		heap.Fix(&h, 0)
	}
	return out
}

// strideSource is one source's place in the interleaving.
type strideSource struct {
	i   int     // source
	d   int     // its draws
	k   int     // draws taken
	u   float64 // phase
	key float64 // (k + u) / d
}

type strideHeap []strideSource

func (h strideHeap) Len() int { return len(h) }
func (h strideHeap) Less(a, b int) bool {
	if h[a].key != h[b].key {
		return h[a].key < h[b].key
	}
	return h[a].i < h[b].i
}
func (h strideHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *strideHeap) Push(x any)   { *h = append(*h, x.(strideSource)) }
func (h *strideHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// DrawID is the id of a draw: the sample's id for its first draw in the
// epoch, id + "#" + repeat for a repetition.
func DrawID(id string, repeat int) string {
	if repeat <= 0 {
		return id
	}
	return id + "#" + strconv.Itoa(repeat)
}

// DrawBase splits a repetition's draw id into the sample id and the repeat
// (DrawID's inverse); ok is false when id does not end in "#" and a
// positive decimal number without leading zeros.
func DrawBase(id string) (base string, repeat int, ok bool) {
	i := strings.LastIndexByte(id, '#')
	if i < 0 || i == len(id)-1 {
		return "", 0, false
	}
	num := id[i+1:]
	if num[0] == '0' {
		return "", 0, false
	}
	for _, c := range num {
		if c < '0' || c > '9' {
			return "", 0, false
		}
	}
	n, err := strconv.Atoi(num)
	if err != nil || n <= 0 {
		return "", 0, false
	}
	return id[:i], n, true
}
