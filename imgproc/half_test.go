package imgproc

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestFloat16Table(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{0, 0x0000},
		{float32(math.Copysign(0, -1)), 0x8000},
		{1, 0x3c00},
		{-2, 0xc000},
		{65504, 0x7bff},                 // max finite
		{65519.996, 0x7bff},             // just below the rounding threshold
		{65520, 0x7c00},                 // ties to even overflows to +Inf
		{1e10, 0x7c00},                  // overflow
		{float32(math.Inf(-1)), 0xfc00}, // -Inf
		{0x1p-14, 0x0400},               // min normal
		{0x1p-24, 0x0001},               // min subnormal
		{0x1p-25, 0x0000},               // tie between 0 and min subnormal: even (0)
		{0x1.000002p-25, 0x0001},        // just above the tie
		{0x3p-25, 0x0002},               // tie 1.5 ulp: even (2)
		{0x1p-26, 0x0000},               // underflow
		{1 + 0x1p-11, 0x3c00},           // tie: even (1.0)
		{1 + 0x3p-11, 0x3c02},           // tie: even (1+2^-9)
		{1 + 0x1p-10, 0x3c01},           // exact
		{0x1.ffcp-15, 0x03ff + 1},       // max subnormal region rounds up to min normal
		{0.1, 0x2e66},
	}
	for _, tc := range cases {
		if got := Float32ToFloat16(tc.in); got != tc.want {
			t.Errorf("Float32ToFloat16(%g) got %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
	if h := Float32ToFloat16(float32(math.NaN())); h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
		t.Errorf("NaN got %#04x, want a NaN", h)
	}
}

// TestFloat16RoundTrip: every half widens and narrows back unchanged.
func TestFloat16RoundTrip(t *testing.T) {
	for h := range 1 << 16 {
		f := Float16ToFloat32(uint16(h))
		got := Float32ToFloat16(f)
		if isNaN16(uint16(h)) {
			if !isNaN16(got) || !math.IsNaN(float64(f)) {
				t.Fatalf("NaN %#04x -> %v -> %#04x", h, f, got)
			}
			continue
		}
		if got != uint16(h) {
			t.Fatalf("%#04x -> %v -> %#04x", h, f, got)
		}
	}
}

func isNaN16(h uint16) bool { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }

// TestFloat16Nearest checks random float32s against the definition: the
// result is a nearest half (by exact float64 distance), ties to even.
func TestFloat16Nearest(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200000 {
		f := math.Float32frombits(rng.Uint32())
		if math.IsNaN(float64(f)) || math.Abs(float64(f)) > 70000 {
			if math.Abs(float64(f)) > 70000 {
				f = float32(float64(f) / 1e30) // fold large values into range
			}
			if math.IsNaN(float64(f)) || math.Abs(float64(f)) > 70000 {
				continue
			}
		}
		checkNearest(t, "f16", f, Float32ToFloat16(f), Float16ToFloat32, 65520)
	}
}

func checkNearest(t *testing.T, name string, f float32, h uint16, widen func(uint16) float32, overflow float64) {
	t.Helper()
	x := float64(f)
	if math.Abs(x) >= overflow {
		if !math.IsInf(float64(widen(h)), 0) {
			t.Fatalf("%s(%g) got %#04x, want Inf", name, f, h)
		}
		return
	}
	got := float64(widen(h))
	d := math.Abs(x - got)
	for _, nb := range []uint16{h - 1, h + 1, h ^ 0x8000} {
		v := float64(widen(nb))
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		dn := math.Abs(x - v)
		if dn < d || (dn == d && h&1 == 1 && nb&1 == 0 && v != got) {
			t.Fatalf("%s(%g) got %#04x (%g), but %#04x (%g) is nearer or even", name, f, h, got, nb, v)
		}
	}
}

func TestBFloat16(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{-2, 0xc000},
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie: even
		{math.Float32frombits(0x3f818000), 0x3f82}, // tie: even (up)
		{math.Float32frombits(0x3f808001), 0x3f81}, // above tie
		{math.Float32frombits(0x7f7fffff), 0x7f80}, // max float rounds to Inf
		{float32(math.Inf(1)), 0x7f80},
		{math.Float32frombits(0x00000001), 0x0000}, // tiny subnormal to 0
	}
	for _, tc := range cases {
		if got := Float32ToBFloat16(tc.in); got != tc.want {
			t.Errorf("Float32ToBFloat16(%g) got %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
	nan := Float32ToBFloat16(math.Float32frombits(0x7f800001)) // NaN with low payload only
	if !math.IsNaN(float64(BFloat16ToFloat32(nan))) {
		t.Errorf("NaN got %#04x, want a NaN", nan)
	}
	for h := range 1 << 16 {
		f := BFloat16ToFloat32(uint16(h))
		if got := Float32ToBFloat16(f); got != uint16(h) && !math.IsNaN(float64(f)) {
			t.Fatalf("%#04x -> %v -> %#04x", h, f, got)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 200000 {
		f := math.Float32frombits(rng.Uint32())
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			continue
		}
		checkNearest(t, "bf16", f, Float32ToBFloat16(f), BFloat16ToFloat32, 0x1.ffp127) // max finite bf16 is 0x1.fep127; half an ulp above rounds to Inf
	}
}
