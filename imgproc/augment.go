package imgproc

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Augment is the seeded augmentation of Config.Augment: a random resized
// crop (torchvision RandomResizedCrop) and a horizontal flip
// (RandomHorizontalFlip). The zero value is no augmentation. A sample's
// parameters (Crop) are a pure function of the generator Sample is given and
// the source's display size; pipeline derives that generator from
// (Seed, epoch, sample id), see docs/augment.md.
type Augment struct {
	// RRC enables the random resized crop. The crop box is resized to
	// Size×Size under PolicyShorterCrop and PolicySquare (RandomResizedCrop
	// semantics: no centre crop afterwards), and by the smart resize of
	// PolicyDynamic, which keeps the box's aspect ratio.
	RRC bool `json:"rrc,omitempty"`
	// Scale is the range of the box's area as a fraction of the source's
	// (default [0.08, 1]); Ratio the range of its aspect ratio w/h, sampled
	// log-uniformly (default [3/4, 4/3]).
	Scale [2]float64 `json:"scale,omitzero"`
	Ratio [2]float64 `json:"ratio,omitzero"`
	// FlipP is the probability of a horizontal flip of the output, in
	// [0, 1] (0: no flip).
	FlipP float64 `json:"flip_p,omitempty"`
	// Seed seeds every sample's parameters (the job seed unless set apart).
	Seed uint64 `json:"seed,omitempty"`
}

// Enabled reports whether a has any effect.
func (a Augment) Enabled() bool { return a.RRC || a.FlipP > 0 }

// Default ranges of the random resized crop (torchvision's).
var (
	DefaultScale = [2]float64{0.08, 1}
	DefaultRatio = [2]float64{3.0 / 4.0, 4.0 / 3.0}
)

// ParseAugment parses a comma-separated list of transforms, each with
// optional colon-separated parameters:
//
//	rrc[:scale=LO-HI][:ratio=LO-HI]   random resized crop (defaults 0.08-1, 0.75-1.3333333333333333)
//	hflip[:p=P]                        horizontal flip with probability P (default 0.5)
//
// "" and "none" are no augmentation. Seed is left 0 for the caller to set.
func ParseAugment(spec string) (Augment, error) {
	var a Augment
	spec = strings.TrimSpace(spec)
	if spec == "" || spec == "none" {
		return a, nil
	}
	bad := func(format string, v ...any) (Augment, error) {
		return Augment{}, fmt.Errorf("imgproc: augment %q: %s: %w", spec, fmt.Sprintf(format, v...), ErrConfig)
	}
	seen := map[string]bool{}
	for _, item := range strings.Split(spec, ",") {
		parts := strings.Split(strings.TrimSpace(item), ":")
		name := parts[0]
		if seen[name] {
			return bad("%s given twice", name)
		}
		seen[name] = true
		switch name {
		case "rrc":
			a.RRC, a.Scale, a.Ratio = true, DefaultScale, DefaultRatio
		case "hflip":
			a.FlipP = 0.5
		default:
			return bad("unknown transform %q (want rrc or hflip)", name)
		}
		for _, kv := range parts[1:] {
			k, v, ok := strings.Cut(kv, "=")
			var err error
			switch {
			case !ok:
				return bad("parameter %q is not key=value", kv)
			case name == "rrc" && k == "scale":
				a.Scale, err = parseRange(v)
			case name == "rrc" && k == "ratio":
				a.Ratio, err = parseRange(v)
			case name == "hflip" && k == "p":
				a.FlipP, err = strconv.ParseFloat(v, 64)
			default:
				return bad("unknown parameter %q of %s", k, name)
			}
			if err != nil {
				return bad("%s %s=%q: %v", name, k, v, err)
			}
		}
	}
	if err := a.Validate(); err != nil {
		return Augment{}, err
	}
	return a, nil
}

// parseRange parses "LO-HI".
func parseRange(s string) (r [2]float64, err error) {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		return r, fmt.Errorf("want LO-HI")
	}
	if r[0], err = strconv.ParseFloat(lo, 64); err != nil {
		return r, err
	}
	r[1], err = strconv.ParseFloat(hi, 64)
	return r, err
}

// String is the canonical spec ParseAugment reads back ("none" for none).
func (a Augment) String() string {
	var parts []string
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	if a.RRC {
		parts = append(parts, fmt.Sprintf("rrc:scale=%s-%s:ratio=%s-%s", f(a.Scale[0]), f(a.Scale[1]), f(a.Ratio[0]), f(a.Ratio[1])))
	}
	if a.FlipP > 0 {
		parts = append(parts, "hflip:p="+f(a.FlipP))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// Validate checks the ranges: 0 < scale lo ≤ hi ≤ 1, 0 < ratio lo ≤ hi, p in [0, 1].
func (a Augment) Validate() error {
	bad := func(format string, v ...any) error {
		return fmt.Errorf("imgproc: augment: %s: %w", fmt.Sprintf(format, v...), ErrConfig)
	}
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	if a.RRC {
		if s := a.Scale; !(finite(s[0]) && finite(s[1]) && s[0] > 0 && s[0] <= s[1] && s[1] <= 1) {
			return bad("scale %v: want 0 < lo ≤ hi ≤ 1", s)
		}
		if r := a.Ratio; !(finite(r[0]) && finite(r[1]) && r[0] > 0 && r[0] <= r[1]) {
			return bad("ratio %v: want 0 < lo ≤ hi", r)
		}
	} else if a.Scale != ([2]float64{}) || a.Ratio != ([2]float64{}) {
		return bad("scale and ratio need rrc")
	}
	if !(a.FlipP >= 0 && a.FlipP <= 1) {
		return bad("flip p %v not in [0, 1]", a.FlipP)
	}
	return nil
}

// Crop is one sample's augmentation: the box (in display-oriented source
// pixels) that is cropped and resized, and whether the output is flipped
// left to right. The zero Crop with Width 0 means the whole image (no crop).
type Crop struct {
	Top, Left, Height, Width int
	Flip                     bool
}

// Rand is the generator Sample draws from (loader.SplitMix64 in pipeline).
type Rand interface {
	Uint64() uint64
}

// unit maps a draw to [0, 1) with 53 bits: (x >> 11) · 2⁻⁵³.
func unit(r Rand) float64 { return float64(r.Uint64()>>11) * 0x1p-53 }

// below maps a draw to [0, n) by multiply-shift: the high 64 bits of x·n.
func below(r Rand, n int) int {
	hi, _ := bits.Mul64(r.Uint64(), uint64(n))
	return int(hi)
}

// Sample draws the parameters for a w×h (display-oriented) source. The first
// draw is the flip's (taken whether or not the flip is enabled): flip when
// unit < FlipP. Then, with RRC, torchvision's RandomResizedCrop.get_params
// with this generator: up to 10 attempts of
//
//	target = w*h * (scale_lo + (scale_hi-scale_lo)*unit)
//	ar     = exp(log(ratio_lo) + (log(ratio_hi)-log(ratio_lo))*unit)
//	cw, ch = round(sqrt(target*ar)), round(sqrt(target/ar))   (half to even)
//	if 0 < cw ≤ w and 0 < ch ≤ h: top = below(h-ch+1), left = below(w-cw+1)
//
// and otherwise the centre crop of the ratio range clamped to the source's.
// Sizes that are not positive give the zero Crop.
func (a Augment) Sample(r Rand, w, h int) Crop {
	var c Crop
	c.Flip = unit(r) < a.FlipP
	if !a.RRC || w <= 0 || h <= 0 {
		return c
	}
	area := float64(w) * float64(h)
	logLo, logHi := math.Log(a.Ratio[0]), math.Log(a.Ratio[1])
	for range 10 {
		// float64() conversions stop the compiler fusing into FMA (arm64,
		// GOAMD64=v3), so Python's unfused arithmetic gives the same boxes.
		target := area * (a.Scale[0] + float64((a.Scale[1]-a.Scale[0])*unit(r)))
		ar := math.Exp(logLo + float64((logHi-logLo)*unit(r)))
		cw := int(math.RoundToEven(math.Sqrt(target * ar)))
		ch := int(math.RoundToEven(math.Sqrt(target / ar)))
		if cw > 0 && cw <= w && ch > 0 && ch <= h {
			c.Top = below(r, h-ch+1)
			c.Left = below(r, w-cw+1)
			c.Height, c.Width = ch, cw
			return c
		}
	}
	cw, ch := w, h
	switch in := float64(w) / float64(h); {
	case in < a.Ratio[0]:
		ch = int(math.RoundToEven(float64(cw) / a.Ratio[0]))
	case in > a.Ratio[1]:
		cw = int(math.RoundToEven(float64(ch) * a.Ratio[1]))
	}
	c.Top, c.Left = (h-ch)/2, (w-cw)/2
	c.Height, c.Width = ch, cw
	return c
}

// cropped reports whether c crops (RRC parameters), and the box size.
func (c Crop) cropped() bool { return c.Width > 0 && c.Height > 0 }

// AugmentedSize is the output width and height for a w×h source under the
// crop c: the box's size through the resize policy, with PolicyShorterCrop
// resizing the box to Size×Size like PolicySquare (RandomResizedCrop). A c
// that does not crop gives OutputSize(w, h).
func (c Config) AugmentedSize(w, h int, cr Crop) (ow, oh int) {
	g, ok := c.augmentPlan(w, h, cr)
	if !ok {
		return 0, 0
	}
	return g.ow, g.oh
}

// AugmentedTokens is the image tokens of AugmentedSize: what the planner
// prices for an augmented sample.
func (c Config) AugmentedTokens(w, h int, cr Crop) int {
	ow, oh := c.AugmentedSize(w, h, cr)
	if c.PatchSize < 1 {
		return 0
	}
	return (oh / c.PatchSize) * (ow / c.PatchSize)
}

// augmentPlan is the geometry of the resize after the crop cr of a w×h
// source: plan of the box, with shorter-crop as square.
func (c Config) augmentPlan(w, h int, cr Crop) (geom, bool) {
	if !cr.cropped() {
		return c.plan(w, h)
	}
	if cr.Left < 0 || cr.Top < 0 || cr.Left+cr.Width > w || cr.Top+cr.Height > h {
		return geom{}, false
	}
	if c.Policy == PolicyShorterCrop {
		c.Policy = PolicySquare
	}
	return c.plan(cr.Width, cr.Height)
}

// ProcessSample is ProcessInto with Config.Augment applied, its parameters
// drawn from r (Augment.Sample on the display-oriented header size): decode
// at full size (DecodeFast drafts nothing when cropping), orient, crop the
// box (Pillow's Image.crop), resize the box by the policy (AugmentedSize),
// flip left to right (Image.transpose(FLIP_LEFT_RIGHT)), encode. On the
// exact decode path the pixels equal torchvision's
// resized_crop(img, top, left, height, width, size) then hflip on the same
// decoded PIL image, bit for bit. Image.Crop records the parameters.
func (p *Processor) ProcessSample(dst, data []byte, r Rand) (Image, error) {
	if r == nil {
		return Image{}, fmt.Errorf("imgproc: process sample: no generator: %w", ErrConfig)
	}
	return p.process(dst, data, r)
}

// cropRGB copies the box cr of packed RGB src (stride 3*w) into the
// scratch and returns it with its size.
func cropRGB(src []byte, w int, cr Crop, s *scratch) ([]byte, int, int) {
	row := 3 * cr.Width
	out := grow(s.crop, row*cr.Height)
	for y := range cr.Height {
		off := 3 * ((cr.Top+y)*w + cr.Left)
		copy(out[y*row:(y+1)*row], src[off:off+row])
	}
	s.crop = out
	return out, cr.Width, cr.Height
}

// flipRGB mirrors packed RGB pix (w×h) left to right in place.
func flipRGB(pix []byte, w, h int) {
	for y := range h {
		row := pix[3*y*w : 3*(y+1)*w]
		for i, j := 0, w-1; i < j; i, j = i+1, j-1 {
			a, b := row[3*i:3*i+3], row[3*j:3*j+3]
			a[0], a[1], a[2], b[0], b[1], b[2] = b[0], b[1], b[2], a[0], a[1], a[2]
		}
	}
}
