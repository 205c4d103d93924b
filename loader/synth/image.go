package synth

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"math"
)

// Content kinds, from cheap to complex.
const (
	kindFlat     = "flat"
	kindGradient = "gradient"
	kindShapes   = "shapes"
	kindNoise    = "noise"
	kindMixed    = "mixed"
)

// imageSpec describes one image to render.
type imageSpec struct {
	w, h    int
	kind    string
	png     bool
	gray    bool
	quality int
}

// pickImage draws an image spec for sample r.
func pickImage(r *rng, c Config) imageSpec {
	if c.Skew == SkewNone {
		return imageSpec{w: c.FixedSide, h: c.FixedSide, kind: kindShapes, quality: 85}
	}
	long := clampInt(int(r.lognorm(256, 0.6)), c.MinSide, c.MaxSide)
	ratio := math.Min(4, math.Max(0.25, math.Exp(0.55*r.norm())))
	w, h := long, int(float64(long)/ratio)
	if ratio < 1 {
		w, h = int(float64(long)*ratio), long
	}
	s := imageSpec{w: clampInt(w, c.MinSide, c.MaxSide), h: clampInt(h, c.MinSide, c.MaxSide), quality: 60 + r.intn(36)}
	kinds := []struct {
		k string
		p float64
	}{{kindFlat, 0.15}, {kindGradient, 0.25}, {kindShapes, 0.30}, {kindNoise, 0.15}, {kindMixed, 0.15}}
	u := r.float()
	for _, k := range kinds {
		if s.kind = k.k; u < k.p {
			break
		}
		u -= k.p
	}
	s.png = r.float() < 0.3
	s.gray = r.float() < 0.05
	if long := max(s.w, s.h); s.png && long > 512 { // PNG encoding is slow: keep PNGs at most 512 px
		s.w = max(1, s.w*512/long)
		s.h = max(1, s.h*512/long)
	}
	return s
}

func clampInt(v, lo, hi int) int { return max(lo, min(hi, v)) }

// render draws the image and encodes it; it returns the bytes and the
// extension ("jpg" or "png").
func render(r *rng, s imageSpec) ([]byte, string, error) {
	img := image.NewRGBA(image.Rect(0, 0, s.w, s.h))
	paint(r, img, s.kind)
	var src image.Image = img
	if s.gray {
		g := image.NewGray(img.Rect)
		for i := range g.Pix {
			p := img.Pix[4*i:]
			g.Pix[i] = uint8((299*int(p[0]) + 587*int(p[1]) + 114*int(p[2])) / 1000)
		}
		src = g
	}
	var buf bytes.Buffer
	if s.png {
		enc := png.Encoder{CompressionLevel: png.BestSpeed}
		if s.kind == kindNoise {
			enc.CompressionLevel = png.NoCompression // noise does not compress; skip the filter search
		}
		if err := enc.Encode(&buf, src); err != nil {
			return nil, "", fmt.Errorf("synth: png: %w", err)
		}
		return buf.Bytes(), "png", nil
	}
	if err := jpeg.Encode(&buf, src, &jpeg.Options{Quality: s.quality}); err != nil {
		return nil, "", fmt.Errorf("synth: jpeg: %w", err)
	}
	return buf.Bytes(), "jpg", nil
}

func randColor(r *rng) color.RGBA {
	v := r.u64()
	return color.RGBA{uint8(v), uint8(v >> 8), uint8(v >> 16), 255}
}

// paint fills img according to kind.
func paint(r *rng, img *image.RGBA, kind string) {
	switch kind {
	case kindFlat:
		fill(img, randColor(r))
	case kindGradient:
		gradient(r, img)
	case kindShapes:
		fill(img, randColor(r))
		shapes(r, img, 3+r.intn(12))
	case kindNoise:
		noise(r, img, 255)
	default:
		gradient(r, img)
		shapes(r, img, 5+r.intn(20))
		noise(r, img, 48)
	}
}

func fill(img *image.RGBA, c color.RGBA) {
	for i := 0; i < len(img.Pix); i += 4 {
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = c.R, c.G, c.B, 255
	}
}

func gradient(r *rng, img *image.RGBA) {
	a, b := randColor(r), randColor(r)
	w, h := img.Rect.Dx(), img.Rect.Dy()
	diag := r.float() < 0.5
	for y := range h {
		row := img.Pix[y*img.Stride:]
		for x := range w {
			t := float64(x) / float64(max(1, w-1))
			if diag {
				t = (t + float64(y)/float64(max(1, h-1))) / 2
			}
			o := 4 * x
			row[o] = lerp(a.R, b.R, t)
			row[o+1] = lerp(a.G, b.G, t)
			row[o+2] = lerp(a.B, b.B, t)
			row[o+3] = 255
		}
	}
}

func lerp(a, b uint8, t float64) uint8 { return uint8(float64(a) + (float64(b)-float64(a))*t) }

// shapes draws n filled rectangles and discs.
func shapes(r *rng, img *image.RGBA, n int) {
	w, h := img.Rect.Dx(), img.Rect.Dy()
	for range n {
		c := randColor(r)
		x0, y0 := r.intn(w), r.intn(h)
		rw, rh := 1+r.intn(max(1, w/2)), 1+r.intn(max(1, h/2))
		disc := r.float() < 0.5
		for y := y0; y < min(h, y0+rh); y++ {
			for x := x0; x < min(w, x0+rw); x++ {
				if disc && !inEllipse(x-x0, y-y0, rw, rh) {
					continue
				}
				o := y*img.Stride + 4*x
				img.Pix[o], img.Pix[o+1], img.Pix[o+2] = c.R, c.G, c.B
			}
		}
	}
}

func inEllipse(dx, dy, rw, rh int) bool {
	fx := (float64(dx) - float64(rw)/2) / (float64(rw) / 2)
	fy := (float64(dy) - float64(rh)/2) / (float64(rh) / 2)
	return fx*fx+fy*fy <= 1
}

// noise adds uniform noise of the given amplitude (255 replaces the pixel).
func noise(r *rng, img *image.RGBA, amp int) {
	for i := 0; i < len(img.Pix); i += 4 {
		v := r.u64()
		for c := range 3 {
			n := int(uint8(v >> (8 * c)))
			if amp < 255 {
				n = int(img.Pix[i+c]) + n*amp/255 - amp/2
			}
			img.Pix[i+c] = uint8(clampInt(n, 0, 255))
		}
		img.Pix[i+3] = 255
	}
}
