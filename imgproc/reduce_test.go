package imgproc

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"slices"
	"testing"
)

func TestBoxReduce(t *testing.T) {
	px := func(v ...uint8) []byte { // gray pixels as packed RGB
		out := make([]byte, 0, 3*len(v))
		for _, g := range v {
			out = append(out, g, g, g)
		}
		return out
	}
	for _, tc := range []struct {
		name         string
		src          []byte
		w, h, fx, fy int
		want         []byte
		wantW, wantH int
	}{
		{"2x2 boxes", px(0, 2, 10, 20, 4, 6, 30, 41), 4, 2, 2, 2, px(3, 25), 2, 1},
		{"rounds half up", px(0, 1), 2, 1, 2, 1, px(1), 1, 1},
		{"partial edge boxes", px(10, 20, 90, 30, 40, 60, 50, 70, 200), 3, 3, 2, 2, px(25, 75, 60, 200), 2, 2},
		{"rows only", px(1, 2, 3, 5), 2, 2, 1, 2, px(2, 4), 2, 1},
		{"channels apart", []byte{255, 0, 10, 0, 255, 20}, 2, 1, 2, 1, []byte{128, 128, 15}, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, w, h := boxReduce(tc.src, tc.w, tc.h, tc.fx, tc.fy, nil, nil)
			if w != tc.wantW || h != tc.wantH || !bytes.Equal(got, tc.want) {
				t.Errorf("got %d×%d %v, want %d×%d %v", w, h, got, tc.wantW, tc.wantH, tc.want)
			}
		})
	}
}

func TestReduceFactors(t *testing.T) {
	for _, tc := range []struct{ w, h, rw, rh, fx, fy int }{
		{1920, 1080, 398, 224, 2, 2},
		{4000, 1000, 896, 224, 2, 2},
		{447, 447, 224, 224, 1, 1}, // below twice the target: untouched
		{448, 2000, 224, 999, 1, 1},
		{3584, 1792, 224, 224, 8, 4},
		{100, 100, 224, 224, 1, 1}, // upscale
	} {
		if fx, fy := reduceFactors(tc.w, tc.h, tc.rw, tc.rh); fx != tc.fx || fy != tc.fy {
			t.Errorf("reduceFactors(%d, %d, %d, %d) = %d, %d, want %d, %d", tc.w, tc.h, tc.rw, tc.rh, fx, fy, tc.fx, tc.fy)
		}
	}
}

func TestEighthsScale(t *testing.T) {
	for _, tc := range []struct {
		w, h, tw, th int
		gap          float64
		want         int
	}{
		{1280, 810, 354, 224, 1, 3}, // 480×304
		{1000, 1000, 224, 224, 2, 4},
		{224, 224, 224, 224, 1, 8},
		{1792, 1792, 224, 224, 1, 1},
		{4000, 4000, 224, 224, 1, 1},
		{900, 900, 224, 224, 0, 8}, // no scaling
		{900, 200, 224, 224, 1, 8}, // already too small on one axis
	} {
		if got := eighthsScale(tc.w, tc.h, tc.tw, tc.th, tc.gap); got != tc.want {
			t.Errorf("eighthsScale(%d, %d, %d, %d, %g) = %d, want %d", tc.w, tc.h, tc.tw, tc.th, tc.gap, got, tc.want)
		}
	}
}

// smoothImage is a photo-like w×h pattern: gradients and a low-frequency
// wave, no detail finer than a few hundredths of the image.
func smoothImage(w, h int) *image.NRGBA {
	m := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			u, v := float64(x)/float64(w), float64(y)/float64(h)
			s := 0.5 + 0.5*math.Sin(2*math.Pi*(3*u+2*v))
			m.SetNRGBA(x, y, color.NRGBA{uint8(255 * u), uint8(255 * v), uint8(255 * s), 255})
		}
	}
	return m
}

// TestDecodeReduce: DecodeReduce gives the exact tensor's shape within a
// PSNR floor of it for sources it reduces (PNG box-reduced, JPEG scaled by
// n/8 in the libjpeg-turbo build), and the exact bytes for a source too
// small to reduce.
func TestDecodeReduce(t *testing.T) {
	var pngBig bytes.Buffer
	if err := png.Encode(&pngBig, smoothImage(1900, 1300)); err != nil {
		t.Fatal(err)
	}
	small := encoded(t)["go.png"]
	for _, tc := range []struct {
		name   string
		data   []byte
		policy string
		floor  float64 // dB; +Inf: bit-identical
	}{
		{"png shorter-crop", pngBig.Bytes(), PolicyShorterCrop, 35},
		{"png square", pngBig.Bytes(), PolicySquare, 35},
		{"png dynamic", pngBig.Bytes(), PolicyDynamic, 35},
		{"jpeg shorter-crop", encodeJPEG(t, smoothImage(1900, 1300), 95), PolicyShorterCrop, 35},
		{"small png untouched", small, PolicyShorterCrop, math.Inf(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.DType, c.Policy = DTypeUint8, tc.policy
			pe, err := NewProcessor(c)
			if err != nil {
				t.Fatal(err)
			}
			c.Decode = DecodeReduce
			pr, err := NewProcessor(c)
			if err != nil {
				t.Fatal(err)
			}
			a, err := pe.Process(tc.data)
			if err != nil {
				t.Fatal(err)
			}
			b, err := pr.Process(tc.data)
			if err != nil {
				t.Fatal(err)
			}
			if a.Shape != b.Shape || a.Grid != b.Grid {
				t.Fatalf("shape %v grid %v, want %v %v", b.Shape, b.Grid, a.Shape, a.Grid)
			}
			if got := psnrU8(a.Data, b.Data); got < tc.floor {
				t.Errorf("PSNR %.2f dB against exact, want >= %g", got, tc.floor)
			}
		})
	}
}

// TestDecodeReduceAugmented: with the crop augmentation, DecodeReduce reduces the cropped
// box (same crop, same shape as DecodeExact) within the PSNR floor.
func TestDecodeReduceAugmented(t *testing.T) {
	var buf bytes.Buffer
	if err := png.Encode(&buf, smoothImage(1900, 1300)); err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.DType = DTypeUint8
	c.Augment = Augment{RRC: true, Scale: DefaultScale, Ratio: DefaultRatio, FlipP: 0.5}
	pe, err := NewProcessor(c)
	if err != nil {
		t.Fatal(err)
	}
	c.Decode = DecodeReduce
	pr, err := NewProcessor(c)
	if err != nil {
		t.Fatal(err)
	}
	for seed := range uint64(6) {
		a, err := pe.ProcessSample(nil, buf.Bytes(), &splitmix{seed})
		if err != nil {
			t.Fatal(err)
		}
		b, err := pr.ProcessSample(nil, buf.Bytes(), &splitmix{seed})
		if err != nil {
			t.Fatal(err)
		}
		if a.Crop != b.Crop || a.Shape != b.Shape {
			t.Fatalf("seed %d: crop %+v shape %v, want %+v %v", seed, b.Crop, b.Shape, a.Crop, a.Shape)
		}
		if got := psnrU8(a.Data, b.Data); got < 35 {
			t.Errorf("seed %d crop %+v: PSNR %.2f dB against exact, want >= 35", seed, a.Crop, got)
		}
	}
}

// TestDecodeReducePSNR measures what DecodeReduce costs in quality: the PSNR of its uint8
// tensors against DecodeExact's on the real corpus's images (corpusImages: 400 spread over
// it, all formats; skipped without one). docs/imgproc.md quotes the log.
func TestDecodeReducePSNR(t *testing.T) {
	if testing.Short() {
		t.Skip("decodes corpus images")
	}
	paths := corpusImages(t)
	exact := DefaultConfig()
	exact.DType = DTypeUint8
	reduce := exact
	reduce.Decode = DecodeReduce
	pe, err := NewProcessor(exact)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := NewProcessor(reduce)
	if err != nil {
		t.Fatal(err)
	}
	var all, changed []float64
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		a, errA := pe.Process(data)
		b, errB := pr.Process(data)
		if (errA == nil) != (errB == nil) {
			t.Fatalf("%s: exact err %v, reduce err %v", p, errA, errB)
		}
		if errA != nil {
			continue
		}
		db := psnrU8(a.Data, b.Data)
		all = append(all, db)
		if !math.IsInf(db, 1) {
			changed = append(changed, db)
		}
	}
	slices.Sort(all)
	t.Logf("%d corpus images: %d changed by reduce; PSNR vs exact min %.2f dB, p05 %.2f dB, median %.2f dB (all), median %.2f dB (changed only)",
		len(all), len(changed), all[0], all[len(all)/20], all[len(all)/2], medianOr(changed))
	if p05 := all[len(all)/20]; p05 < 30 {
		t.Errorf("p05 PSNR %.2f dB, want >= 30", p05)
	}
}

func BenchmarkDecodeReduce(b *testing.B) {
	var buf bytes.Buffer
	if err := png.Encode(&buf, smoothImage(1900, 1300)); err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{DecodeExact, DecodeReduce} {
		c := DefaultConfig()
		c.DType, c.Decode = DTypeJPEG, mode
		p, err := NewProcessor(c)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("decode=%s", mode), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(buf.Len()))
			for b.Loop() {
				if _, err := p.Process(buf.Bytes()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
