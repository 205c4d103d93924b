package imgproc

import (
	"bytes"
	"image/jpeg"
	"math"
	"testing"
)

// TestEncodeJPEG: a smooth CHW image round-trips at quality 95 above 40 dB (both encoders), with its
// shape; bad shapes and qualities are errors.
func TestEncodeJPEG(t *testing.T) {
	const h, w = 48, 64
	chw := make([]byte, 3*h*w)
	for c := range 3 {
		for y := range h {
			for x := range w {
				chw[c*h*w+y*w+x] = byte(40 + x + y + c*20) // smooth: no edges for 4:2:0 to blur
			}
		}
	}
	b, err := EncodeJPEG(chw, h, w, 95)
	if err != nil {
		t.Fatal(err)
	}
	img, err := jpeg.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if r := img.Bounds(); r.Dx() != w || r.Dy() != h {
		t.Fatalf("decoded %v, want %dx%d", r, w, h)
	}
	var se float64
	for y := range h {
		for x := range w {
			r, g, bl, _ := img.At(x, y).RGBA()
			for c, v := range []uint32{r >> 8, g >> 8, bl >> 8} {
				d := float64(v) - float64(chw[c*h*w+y*w+x])
				se += d * d
			}
		}
	}
	if psnr := 10 * math.Log10(255*255/(se/float64(3*h*w))); psnr < 40 {
		t.Errorf("PSNR %.1f dB at quality 95, want ≥ 40", psnr)
	}
	for _, tc := range []struct {
		name       string
		n, h, w, q int
	}{{"short", 10, h, w, 95}, {"zero side", 0, 0, w, 95}, {"quality 0", 3 * h * w, h, w, 0}, {"quality 101", 3 * h * w, h, w, 101}} {
		if _, err := EncodeJPEG(make([]byte, tc.n), tc.h, tc.w, tc.q); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}
