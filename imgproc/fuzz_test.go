package imgproc

import (
	"testing"
)

func fuzzConfig() Config {
	c := DefaultConfig()
	c.Size = 32
	c.MaxImagePixels = 4 << 20 // keep the fuzzer's memory bounded
	return c
}

// FuzzProcess feeds arbitrary bytes through the whole decode path: it must
// never panic, every error must wrap a sentinel, and every success must have
// the promised shape.
func FuzzProcess(f *testing.F) {
	for _, b := range encoded(f) {
		f.Add(b)
	}
	f.Add(pngHeaderOnly(64, 64))
	f.Add([]byte{})
	p, err := NewProcessor(fuzzConfig())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		img, err := p.Process(data)
		if err != nil {
			if sentinel(err) == nil {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		ow, oh := p.Config().OutputSize(img.SrcWidth, img.SrcHeight)
		if img.Shape != [3]int{3, oh, ow} || len(img.Data) != 3*ow*oh*2 {
			t.Fatalf("shape %v, %d bytes; want [3 %d %d], %d bytes", img.Shape, len(img.Data), oh, ow, 3*ow*oh*2)
		}
		if img.Complexity < 0 || img.Complexity > 1 {
			t.Fatalf("complexity %v outside [0, 1]", img.Complexity)
		}
	})
}

// FuzzReadHeader: header parsing of arbitrary bytes never panics, reports
// sane sizes and orientations, and never quotes content that is no image.
func FuzzReadHeader(f *testing.F) {
	for _, b := range encoded(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ReadHeader(data)
		if err != nil {
			if sentinel(err) == nil {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			if len(data) > 0 && sniff(data) == "" && !namesKindOnly(err.Error()) {
				t.Fatalf("error %q is not the fixed message naming a content kind", err)
			}
			return
		}
		if h.Width <= 0 || h.Height <= 0 || h.Orientation < 1 || h.Orientation > 8 || h.FileBytes != len(data) {
			t.Fatalf("insane header %+v", h)
		}
		_ = HeaderComplexity(h)
	})
}

// FuzzExifOrientation runs the EXIF/TIFF metadata walkers on arbitrary
// bytes as every container.
func FuzzExifOrientation(f *testing.F) {
	imgs := encoded(f)
	f.Add(imgs["seed_exif6.jpg"])
	f.Add([]byte("II\x2a\x00\x08\x00\x00\x00\x01\x00\x12\x01\x03\x00\x01\x00\x00\x00\x06\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, format := range []string{FormatJPEG, FormatPNG, FormatWebP, FormatTIFF} {
			if o := exifOrientation(format, data); o < 1 || o > 8 {
				t.Fatalf("%s orientation %d outside 1..8", format, o)
			}
		}
		_, _, _ = webpFirstFrame(data)
	})
}
