package imgproc

import (
	"bytes"
	"errors"
	"image"
	"image/png"
	"math"
	"testing"
)

// splitmix is a SplitMix64 for the tests (pipeline uses loader's).
type splitmix struct{ s uint64 }

func (r *splitmix) Uint64() uint64 {
	r.s += 0x9E3779B97F4A7C15
	z := r.s
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// fixed replays a list of draws (then zeros).
type fixed struct{ v []uint64 }

func (r *fixed) Uint64() uint64 {
	if len(r.v) == 0 {
		return 0
	}
	x := r.v[0]
	r.v = r.v[1:]
	return x
}

func TestParseAugment(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want Augment
		ok   bool
	}{
		{"", Augment{}, true},
		{"none", Augment{}, true},
		{"rrc", Augment{RRC: true, Scale: DefaultScale, Ratio: DefaultRatio}, true},
		{"hflip", Augment{FlipP: 0.5}, true},
		{"rrc,hflip", Augment{RRC: true, Scale: DefaultScale, Ratio: DefaultRatio, FlipP: 0.5}, true},
		{"rrc:scale=0.5-1:ratio=1-2,hflip:p=0.25", Augment{RRC: true, Scale: [2]float64{0.5, 1}, Ratio: [2]float64{1, 2}, FlipP: 0.25}, true},
		{"rrc:scale=0-1", Augment{}, false},
		{"rrc:scale=0.5-1.5", Augment{}, false},
		{"rrc:scale=0.9-0.5", Augment{}, false},
		{"rrc:ratio=2-1", Augment{}, false},
		{"rrc:ratio=0.5", Augment{}, false},
		{"rrc:p=1", Augment{}, false},
		{"hflip:p=1.5", Augment{}, false},
		{"hflip:p=NaN", Augment{}, false},
		{"rrc,rrc", Augment{}, false},
		{"jitter", Augment{}, false},
		{"hflip:p", Augment{}, false},
	} {
		got, err := ParseAugment(tc.spec)
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("ParseAugment(%q) = %+v, %v; want %+v, ok %v", tc.spec, got, err, tc.want, tc.ok)
			continue
		}
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Errorf("ParseAugment(%q): %v does not wrap ErrConfig", tc.spec, err)
			}
			continue
		}
		back, err := ParseAugment(got.String())
		if err != nil || back != got {
			t.Errorf("ParseAugment(%q).String() = %q reads back as %+v, %v", tc.spec, got.String(), back, err)
		}
	}
}

// Sample is deterministic, keeps its boxes inside the image and within the
// scale and ratio ranges (up to rounding), flips about p of the time, and
// varies with the generator.
func TestSampleRanges(t *testing.T) {
	a := Augment{RRC: true, Scale: [2]float64{0.2, 0.6}, Ratio: [2]float64{0.5, 2}, FlipP: 0.3}
	for _, sz := range [][2]int{{640, 480}, {37, 23}, {1, 1}, {3, 1000}, {999, 2}} {
		w, h := sz[0], sz[1]
		flips, boxes := 0, map[Crop]bool{}
		const n = 2000
		for i := range n {
			c := a.Sample(&splitmix{uint64(i)}, w, h)
			if again := a.Sample(&splitmix{uint64(i)}, w, h); again != c {
				t.Fatalf("%dx%d seed %d: %+v then %+v", w, h, i, c, again)
			}
			if c.Width < 1 || c.Height < 1 || c.Left < 0 || c.Top < 0 || c.Left+c.Width > w || c.Top+c.Height > h {
				t.Fatalf("%dx%d seed %d: box %+v outside the image", w, h, i, c)
			}
			if w >= 100 && h >= 100 { // big enough that rounding stays small
				frac := float64(c.Width*c.Height) / float64(w*h)
				ratio := float64(c.Width) / float64(c.Height)
				if frac < 0.2*0.95 || frac > 0.6*1.05 || ratio < 0.5*0.97 || ratio > 2*1.03 {
					t.Fatalf("%dx%d seed %d: box %+v: area %.3f, ratio %.3f out of range", w, h, i, c, frac, ratio)
				}
			}
			if c.Flip {
				flips++
			}
			boxes[Crop{c.Top, c.Left, c.Height, c.Width, false}] = true
		}
		if p := float64(flips) / n; math.Abs(p-0.3) > 0.05 {
			t.Errorf("%dx%d: flipped %.3f of the time, want 0.3", w, h, p)
		}
		if w*h > 100 && max(w, h) < 10*min(w, h) && len(boxes) < 100 { // extreme aspects always fall back
			t.Errorf("%dx%d: only %d distinct boxes in %d draws", w, h, len(boxes), n)
		}
	}
}

// The fallback: when 10 attempts miss, the centre crop of the ratio range
// clamped to the source's aspect (torchvision's), here forced by draws
// that ask for the whole area at the extreme ratios.
func TestSampleFallback(t *testing.T) {
	a := Augment{RRC: true, Scale: [2]float64{1, 1}, Ratio: [2]float64{0.75, 4.0 / 3.0}}
	for _, tc := range []struct {
		w, h int
		want Crop
	}{
		// 100×10 is wider than 4/3: full height, width round(10·4/3) = 13, centred.
		{100, 10, Crop{Top: 0, Left: 43, Height: 10, Width: 13}},
		// 10×100 is taller than 3/4: full width, height round(10/0.75) = 13.
		{10, 100, Crop{Top: 43, Left: 0, Height: 13, Width: 10}},
	} {
		// unit 0 for the flip, then (scale, ratio) draws: ratio lo for a
		// wide image asks for a box taller than it, hi for a tall one.
		draws := []uint64{0}
		for range 10 {
			r := uint64(0) // ratio 0.75: too tall for 100×10
			if tc.h > tc.w {
				r = math.MaxUint64 // ratio near 4/3: too wide for 10×100
			}
			draws = append(draws, 0, r)
		}
		got := a.Sample(&fixed{draws}, tc.w, tc.h)
		if got != tc.want {
			t.Errorf("%dx%d: %+v, want %+v", tc.w, tc.h, got, tc.want)
		}
	}
	// A box that fits at the first attempt: 3×1 at ratio 2 gives 2×1 at (0, 0).
	in := Augment{RRC: true, Scale: [2]float64{1, 1}, Ratio: [2]float64{2, 2}}
	if got, want := in.Sample(&fixed{}, 3, 1), (Crop{Height: 1, Width: 2, Left: 0}); got != want {
		t.Errorf("3x1 at ratio 2: %+v, want %+v", got, want)
	}
	if got := a.Sample(&splitmix{1}, 0, 5); got.cropped() {
		t.Errorf("0x5: %+v, want no crop", got)
	}
}

// AugmentedSize: a fixed policy resizes every box to Size×Size; dynamic
// resolution smart-resizes the box, so the planner prices the crop.
func TestAugmentedSize(t *testing.T) {
	c := DefaultConfig()
	cr := Crop{Top: 10, Left: 20, Height: 300, Width: 90}
	if w, h := c.AugmentedSize(640, 480, cr); w != 224 || h != 224 {
		t.Errorf("shorter-crop: %dx%d, want 224x224", w, h)
	}
	c.Policy = PolicyDynamic
	rh, rw := smartResize(300, 90, c.PatchSize, c.MinPixels, c.MaxPixels)
	if w, h := c.AugmentedSize(640, 480, cr); w != rw || h != rh {
		t.Errorf("dynamic: %dx%d, want %dx%d", w, h, rw, rh)
	}
	if got, want := c.AugmentedTokens(640, 480, cr), (rh/16)*(rw/16); got != want {
		t.Errorf("dynamic tokens %d, want %d", got, want)
	}
	if got, want := c.AugmentedTokens(640, 480, Crop{}), c.ImageTokens(640, 480); got != want {
		t.Errorf("no crop: %d tokens, want ImageTokens %d", got, want)
	}
	if w, h := c.AugmentedSize(100, 100, cr); w != 0 || h != 0 {
		t.Errorf("box outside the image: %dx%d, want 0x0", w, h)
	}
}

// ProcessSample's crop is Image.crop then resize: the same tensor as
// processing a lossless copy of the box with PolicySquare (or dynamic);
// its flip mirrors the output. Checked for bilinear and bicubic, with and
// without EXIF rotation of a JPEG source.
func TestProcessSampleIsCropThenResize(t *testing.T) {
	src := testImage(97, 61, false)
	var pngBytes bytes.Buffer
	if err := png.Encode(&pngBytes, src); err != nil {
		t.Fatal(err)
	}
	for _, policy := range []string{PolicyShorterCrop, PolicyDynamic} {
		for _, filter := range []string{FilterBilinear, FilterBicubic} {
			c := DefaultConfig()
			c.Policy, c.Filter, c.Size, c.DType = policy, filter, 24, DTypeUint8
			c.MinPixels, c.MaxPixels = 16*16, 48*48
			c.Augment = Augment{RRC: true, Scale: DefaultScale, Ratio: DefaultRatio, FlipP: 0.5}
			p, err := NewProcessor(c)
			if err != nil {
				t.Fatal(err)
			}
			ref := c
			ref.Augment = Augment{}
			if ref.Policy == PolicyShorterCrop {
				ref.Policy = PolicySquare
			}
			rp, _ := NewProcessor(ref)
			flips := 0
			for seed := range uint64(12) {
				img, err := p.ProcessSample(nil, pngBytes.Bytes(), &splitmix{seed})
				if err != nil {
					t.Fatal(err)
				}
				cr := img.Crop
				if want := c.Augment.Sample(&splitmix{seed}, 97, 61); cr != want {
					t.Fatalf("Image.Crop %+v, want %+v", cr, want)
				}
				box := src.SubImage(image.Rect(cr.Left, cr.Top, cr.Left+cr.Width, cr.Top+cr.Height))
				var b bytes.Buffer
				if err := png.Encode(&b, box); err != nil {
					t.Fatal(err)
				}
				want, err := rp.Process(b.Bytes())
				if err != nil {
					t.Fatal(err)
				}
				if cr.Flip {
					flips++
					flipCHW(want.Data, want.Shape[2], want.Shape[1])
				}
				if img.Shape != want.Shape || !bytes.Equal(img.Data, want.Data) {
					t.Fatalf("%s %s seed %d crop %+v: shape %v, want %v; pixels differ", policy, filter, seed, cr, img.Shape, want.Shape)
				}
			}
			if flips == 0 || flips == 12 {
				t.Errorf("%s %s: %d of 12 flipped", policy, filter, flips)
			}
		}
	}
}

// flipCHW mirrors a uint8 CHW tensor left to right.
func flipCHW(d []byte, w, h int) {
	for row := range 3 * h {
		r := d[row*w : (row+1)*w]
		for i, j := 0, w-1; i < j; i, j = i+1, j-1 {
			r[i], r[j] = r[j], r[i]
		}
	}
}

// Process ignores Config.Augment; ProcessSample needs a generator; hflip
// alone mirrors the policy's output.
func TestProcessSampleFlipOnly(t *testing.T) {
	data := encoded(t)["go.png"]
	c := DefaultConfig()
	c.Size, c.DType = 16, DTypeUint8
	c.Augment = Augment{FlipP: 1}
	p, err := NewProcessor(c)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := p.Process(data)
	if err != nil {
		t.Fatal(err)
	}
	c.Augment = Augment{}
	q, _ := NewProcessor(c)
	if ref, _ := q.Process(data); !bytes.Equal(plain.Data, ref.Data) {
		t.Fatal("Process applied the augmentation")
	}
	got, err := p.ProcessSample(nil, data, &splitmix{})
	if err != nil {
		t.Fatal(err)
	}
	flipCHW(plain.Data, 16, 16)
	if !got.Crop.Flip || !bytes.Equal(got.Data, plain.Data) {
		t.Fatalf("hflip p=1: crop %+v; mirrored %v", got.Crop, bytes.Equal(got.Data, plain.Data))
	}
	if _, err := p.ProcessSample(nil, data, nil); !errors.Is(err, ErrConfig) {
		t.Fatalf("no generator: %v, want ErrConfig", err)
	}
}

// TestJPEGSourceRefusesAugment: jpeg-source passes the source bytes through
// and the trainer resizes them, so a crop drawn here would be lost; jpeg
// (crop, then encode) takes it.
func TestJPEGSourceRefusesAugment(t *testing.T) {
	aug, err := ParseAugment("rrc,hflip")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		dtype string
		ok    bool
	}{{DTypeJPEGSource, false}, {DTypeJPEG, true}, {DTypeUint8, true}} {
		c := DefaultConfig()
		c.DType, c.Augment = tt.dtype, aug
		if err := c.Validate(); (err == nil) != tt.ok {
			t.Errorf("dtype %s with --augment: %v, want ok %v", tt.dtype, err, tt.ok)
		}
	}
}
