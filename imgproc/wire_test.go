package imgproc

import (
	"bytes"
	"image"
	"image/jpeg"
	"math"
	"os"
	"testing"
)

// decodeCHW decodes a JPEG into a uint8 CHW RGB tensor with Go's decoder.
func decodeCHW(t *testing.T, b []byte) ([]byte, int, int) {
	t.Helper()
	m, err := jpeg.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("wire bytes are not a JPEG: %v", err)
	}
	r := m.Bounds()
	w, h := r.Dx(), r.Dy()
	out := make([]byte, 3*w*h)
	for y := range h {
		for x := range w {
			c, g, bl, _ := m.At(r.Min.X+x, r.Min.Y+y).RGBA()
			out[y*w+x], out[w*h+y*w+x], out[2*w*h+y*w+x] = uint8(c>>8), uint8(g>>8), uint8(bl>>8)
		}
	}
	return out, h, w
}

func psnrU8(a, b []byte) float64 {
	var se float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		se += d * d
	}
	if se == 0 {
		return math.Inf(1)
	}
	return 10 * math.Log10(255*255/(se/float64(len(a))))
}

func wireProcessor(t *testing.T, dtype, policy string) *Processor {
	t.Helper()
	c := DefaultConfig()
	c.DType, c.Policy, c.Size, c.MinPixels, c.MaxPixels = dtype, policy, 32, 16*16, 64*64
	p, err := NewProcessor(c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestJPEGWire: the jpeg dtype (and jpeg-source's fallback) is a JPEG of the
// planned shape within a PSNR floor of the exact uint8 tensor; jpeg-source
// passes an acceptable JPEG through byte for byte and falls back for PNG,
// CMYK, EXIF-rotated and oversized sources.
func TestJPEGWire(t *testing.T) {
	floor := 30.0 // dB against the uint8 tensor, small synthetic images at q95
	if !haveTurbo {
		floor = 22 // image/jpeg subsamples chroma 4:2:0 (EncodeJPEG)
	}
	big := encodeJPEG(t, testImage(2100, 2100, false), 100)
	read := func(name string) []byte {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name, dtype, policy string
		data                []byte
		source              bool // jpeg-source passes the bytes through
	}{
		{"jpeg baseline", DTypeJPEG, PolicyShorterCrop, encodeJPEG(t, testImage(61, 47, false), 90), false},
		{"jpeg png", DTypeJPEG, PolicyShorterCrop, read("seed_palette.png"), false},
		{"jpeg dynamic", DTypeJPEG, PolicyDynamic, encodeJPEG(t, testImage(61, 47, false), 90), false},
		{"source baseline", DTypeJPEGSource, PolicyShorterCrop, encodeJPEG(t, testImage(61, 47, false), 90), true},
		{"source progressive", DTypeJPEGSource, PolicySquare, read("seed_progressive.jpg"), true},
		{"source gray", DTypeJPEGSource, PolicyDynamic, read("seed_gray.jpg"), true},
		{"source png falls back", DTypeJPEGSource, PolicyShorterCrop, read("seed_palette.png"), false},
		{"source cmyk falls back", DTypeJPEGSource, PolicyShorterCrop, read("seed_cmyk.jpg"), false},
		{"source exif falls back", DTypeJPEGSource, PolicyShorterCrop, read("seed_exif6.jpg"), false},
		{"source too many pixels falls back", DTypeJPEGSource, PolicyShorterCrop, big, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exact, err := wireProcessor(t, DTypeUint8, tc.policy).Process(tc.data)
			if err != nil {
				t.Fatal(err)
			}
			img, err := wireProcessor(t, tc.dtype, tc.policy).Process(tc.data)
			if err != nil {
				t.Fatal(err)
			}
			if img.DType != tc.dtype || img.Shape != exact.Shape || img.Grid != exact.Grid {
				t.Fatalf("got dtype %s shape %v grid %v, want %s %v %v", img.DType, img.Shape, img.Grid, tc.dtype, exact.Shape, exact.Grid)
			}
			if img.Source != tc.source {
				t.Fatalf("Source = %v, want %v", img.Source, tc.source)
			}
			if tc.source {
				if !bytes.Equal(img.Data, tc.data) {
					t.Fatal("jpeg-source changed an acceptable source's bytes")
				}
				return
			}
			want, err := EncodeJPEG(exact.Data, exact.Shape[1], exact.Shape[2], WireJPEGQuality)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(img.Data, want) {
				t.Error("wire JPEG differs from EncodeJPEG of the exact uint8 tensor")
			}
			pix, h, w := decodeCHW(t, img.Data)
			if h != exact.Shape[1] || w != exact.Shape[2] {
				t.Fatalf("decoded %d×%d, want %d×%d", h, w, exact.Shape[1], exact.Shape[2])
			}
			if got := psnrU8(pix, exact.Data); got < floor {
				t.Errorf("PSNR %.1f dB against the exact tensor, want >= %.0f", got, floor)
			}
		})
	}
}

func encodeJPEG(t *testing.T, m image.Image, q int) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := jpeg.Encode(&b, m, &jpeg.Options{Quality: q}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestSourceJPEGAcceptable checks each condition of the definition.
func TestSourceJPEGAcceptable(t *testing.T) {
	ok := Header{Format: FormatJPEG, Width: 640, Height: 480, BitsPerPixel: 24, FileBytes: 100 << 10, Orientation: 1}
	for _, tc := range []struct {
		name string
		edit func(*Header)
		want bool
	}{
		{"ycbcr", func(*Header) {}, true},
		{"gray", func(h *Header) { h.BitsPerPixel = 8 }, true},
		{"png", func(h *Header) { h.Format = FormatPNG }, false},
		{"cmyk", func(h *Header) { h.BitsPerPixel = 32 }, false},
		{"rotated", func(h *Header) { h.Orientation = 6 }, false},
		{"bytes at cap", func(h *Header) { h.FileBytes = SourceJPEGMaxBytes }, true},
		{"bytes over cap", func(h *Header) { h.FileBytes = SourceJPEGMaxBytes + 1 }, false},
		{"pixels over cap", func(h *Header) { h.Width, h.Height = 2049, 2048 }, false},
	} {
		h := ok
		tc.edit(&h)
		if got := SourceJPEGAcceptable(h); got != tc.want {
			t.Errorf("%s: SourceJPEGAcceptable = %v, want %v", tc.name, got, tc.want)
		}
	}
}
