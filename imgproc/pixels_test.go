package imgproc

import (
	"bytes"
	"encoding/binary"
	"image/jpeg"
	"math"
	"math/rand/v2"
	"testing"
)

// TestOrient checks each EXIF orientation on a 3×2 image against the
// transform written out by hand (pixels labelled by their source index).
func TestOrient(t *testing.T) {
	// src (w=3, h=2):  0 1 2
	//                  3 4 5
	src := make([]byte, 0, 18)
	for i := range 6 {
		src = append(src, byte(i), byte(i), byte(i))
	}
	cases := []struct {
		o    int
		w, h int
		want []byte
	}{
		{1, 3, 2, []byte{0, 1, 2, 3, 4, 5}},
		{2, 3, 2, []byte{2, 1, 0, 5, 4, 3}},
		{3, 3, 2, []byte{5, 4, 3, 2, 1, 0}},
		{4, 3, 2, []byte{3, 4, 5, 0, 1, 2}},
		{5, 2, 3, []byte{0, 3, 1, 4, 2, 5}},
		{6, 2, 3, []byte{3, 0, 4, 1, 5, 2}}, // 90° clockwise
		{7, 2, 3, []byte{5, 2, 4, 1, 3, 0}},
		{8, 2, 3, []byte{2, 5, 1, 4, 0, 3}}, // 90° counter-clockwise
	}
	for _, tc := range cases {
		out, w, h := orient(src, 3, 2, tc.o, nil)
		var got []byte
		for i := 0; i < len(out); i += 3 {
			got = append(got, out[i])
		}
		if w != tc.w || h != tc.h || !bytes.Equal(got, tc.want) {
			t.Errorf("orientation %d got %dx%d %v, want %dx%d %v", tc.o, w, h, got, tc.w, tc.h, tc.want)
		}
	}
}

func TestExifOrientationParsers(t *testing.T) {
	var base bytes.Buffer
	if err := jpeg.Encode(&base, testImage(8, 8, false), nil); err != nil {
		t.Fatal(err)
	}
	le := []byte("II\x2a\x00\x08\x00\x00\x00\x02\x00" + // IFD0 with 2 entries
		"\x0f\x01\x02\x00\x01\x00\x00\x00\x00\x00\x00\x00" + // Make (ignored)
		"\x12\x01\x03\x00\x01\x00\x00\x00\x08\x00\x00\x00") // Orientation = 8
	pngE := append([]byte("\x89PNG\r\n\x1a\n"), pngChunk("IHDR", make([]byte, 13))...)
	pngE = append(pngE, pngChunk("eXIf", le)...)
	webpE := []byte("RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00")
	webpE = append(webpE, "EXIF"...)
	webpE = binary.LittleEndian.AppendUint32(webpE, uint32(6+len(le)))
	webpE = append(append(webpE, "Exif\x00\x00"...), le...)
	cases := []struct {
		name   string
		format string
		data   []byte
		want   int
	}{
		{"jpeg big-endian 7", FormatJPEG, jpegWithExif(t, base.Bytes(), 7), 7},
		{"jpeg none", FormatJPEG, base.Bytes(), 1},
		{"jpeg out of range", FormatJPEG, jpegWithExif(t, base.Bytes(), 0), 1},
		{"png eXIf little-endian", FormatPNG, pngE, 8},
		{"webp EXIF with prefix", FormatWebP, webpE, 8},
		{"tiff", FormatTIFF, le, 8},
		{"tiff truncated IFD", FormatTIFF, le[:20], 1},
		{"bad byte order", FormatTIFF, append([]byte("XX"), le[2:]...), 1},
		{"gif", FormatGIF, []byte("GIF89a"), 1},
	}
	for _, tc := range cases {
		if got := exifOrientation(tc.format, tc.data); got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestPixelComplexity(t *testing.T) {
	const n = 128
	mk := func(f func(x, y int) byte) []byte {
		b := make([]byte, 3*n*n)
		for y := range n {
			for x := range n {
				v := f(x, y)
				b[3*(y*n+x)], b[3*(y*n+x)+1], b[3*(y*n+x)+2] = v, v, v
			}
		}
		return b
	}
	rng := rand.New(rand.NewPCG(1, 1))
	flat := mk(func(x, y int) byte { return 90 })
	ramp := mk(func(x, y int) byte { return byte(x * 2) })
	noise := mk(func(x, y int) byte { return byte(rng.Uint32()) })
	checker := mk(func(x, y int) byte { // 2x2 blocks: a 1-pixel checkerboard at 64x64
		if (x/2+y/2)%2 == 0 {
			return 255
		}
		return 0
	})
	cf, _ := pixelComplexity(flat, n, n, nil)
	cr, _ := pixelComplexity(ramp, n, n, nil)
	cn, _ := pixelComplexity(noise, n, n, nil)
	cc, _ := pixelComplexity(checker, n, n, nil)
	if cf != 0 {
		t.Errorf("flat got %v, want 0", cf)
	}
	if math.Abs(cc-1) > 1e-6 {
		t.Errorf("checkerboard got %v, want 1", cc)
	}
	if !(cf < cr && cr < cn && cn < cc) {
		t.Errorf("order got flat %v, ramp %v, noise %v, checker %v; want increasing", cf, cr, cn, cc)
	}
	if c, _ := pixelComplexity(flat[:3], 1, 1, nil); c != 0 {
		t.Errorf("1x1 got %v, want 0", c)
	}
}

func TestHeaderComplexity(t *testing.T) {
	enc := func(f func(x, y int) byte) Header {
		var b bytes.Buffer
		m := testImage(256, 256, false)
		for y := range 256 {
			for x := range 256 {
				i := m.PixOffset(x, y)
				v := f(x, y)
				m.Pix[i], m.Pix[i+1], m.Pix[i+2] = v, v, v
			}
		}
		if err := jpeg.Encode(&b, m, &jpeg.Options{Quality: 90}); err != nil {
			t.Fatal(err)
		}
		h, err := ReadHeader(b.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	rng := rand.New(rand.NewPCG(9, 9))
	flat := HeaderComplexity(enc(func(x, y int) byte { return 128 }))
	noisy := HeaderComplexity(enc(func(x, y int) byte { return byte(rng.Uint32()) }))
	if !(0 <= flat && flat < noisy && noisy <= 1) {
		t.Errorf("header complexity flat %v, noisy %v; want 0 <= flat < noisy <= 1", flat, noisy)
	}
	if got := HeaderComplexity(Header{}); got != 0.5 {
		t.Errorf("empty header got %v, want 0.5", got)
	}
}

// TestNormalizeDTypes checks that all dtypes encode the same tensor: the
// float16/bfloat16 values are the rounded float32 values, uint8 holds the
// raw pixels that (x/255-mean)/std maps to the float32 values.
func TestNormalizeDTypes(t *testing.T) {
	imgs := encoded(t)
	data := imgs["go.png"]
	out := map[string]Image{}
	for _, dt := range []string{DTypeFloat32, DTypeFloat16, DTypeBFloat16, DTypeUint8} {
		c := DefaultConfig()
		c.DType = dt
		c.Norm = NormCLIP
		p, err := NewProcessor(c)
		if err != nil {
			t.Fatal(err)
		}
		img, err := p.Process(data)
		if err != nil {
			t.Fatal(err)
		}
		out[dt] = img
	}
	f32 := out[DTypeFloat32]
	plane := 224 * 224
	mean, std := clipMean, clipStd
	for i := range 3 * plane {
		c := i / plane
		want := math.Float32frombits(binary.LittleEndian.Uint32(f32.Data[4*i:]))
		u8 := out[DTypeUint8].Data[i]
		if got := (float32(u8)/255 - mean[c]) / std[c]; got != want {
			t.Fatalf("uint8 elem %d: (%d/255-mean)/std = %v, want %v", i, u8, got, want)
		}
		if got, w := binary.LittleEndian.Uint16(out[DTypeFloat16].Data[2*i:]), Float32ToFloat16(want); got != w {
			t.Fatalf("float16 elem %d got %#04x, want %#04x", i, got, w)
		}
		if got, w := binary.LittleEndian.Uint16(out[DTypeBFloat16].Data[2*i:]), Float32ToBFloat16(want); got != w {
			t.Fatalf("bfloat16 elem %d got %#04x, want %#04x", i, got, w)
		}
	}
	if out[DTypeUint8].Mean != clipMean || out[DTypeUint8].Std != clipStd {
		t.Errorf("uint8 image carries mean %v std %v, want CLIP's", out[DTypeUint8].Mean, out[DTypeUint8].Std)
	}
}
