package synth

import (
	"math"
	"math/bits"
)

// rng is SplitMix64; each sample gets its own stream from (seed, index) so
// output does not depend on scheduling.
type rng struct{ s uint64 }

func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

func newRng(seed uint64, i int) *rng {
	return &rng{s: mix(seed ^ mix(uint64(i)+0x9E3779B97F4A7C15))}
}

func (r *rng) u64() uint64 {
	r.s += 0x9E3779B97F4A7C15
	return mix(r.s)
}

// intn returns a value in [0, n), n > 0.
func (r *rng) intn(n int) int {
	hi, _ := bits.Mul64(r.u64(), uint64(n))
	return int(hi)
}

// float returns a value in [0, 1).
func (r *rng) float() float64 { return float64(r.u64()>>11) / (1 << 53) }

// norm returns a standard normal value (Box–Muller).
func (r *rng) norm() float64 {
	u := 1 - r.float()
	return math.Sqrt(-2*math.Log(u)) * math.Cos(2*math.Pi*r.float())
}

// lognorm returns exp(N(log(median), sigma)).
func (r *rng) lognorm(median, sigma float64) float64 {
	return median * math.Exp(sigma*r.norm())
}
