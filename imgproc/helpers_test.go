package imgproc

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/image/bmp"
	"golang.org/x/image/tiff"
)

// testImage is a deterministic RGBA pattern with some alpha.
func testImage(w, h int, alpha bool) *image.NRGBA {
	m := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			a := uint8(255)
			if alpha {
				a = uint8(x * 255 / max(w-1, 1))
			}
			m.SetNRGBA(x, y, color.NRGBA{uint8(x * 7), uint8(y * 13), uint8((x ^ y) * 5), a})
		}
	}
	return m
}

// encoded returns small valid images of every format Go can encode, plus
// the committed seeds in testdata (WebP, progressive/CMYK/EXIF JPEG, ...).
func encoded(t testing.TB) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	enc := func(name string, f func(*bytes.Buffer) error) {
		var b bytes.Buffer
		if err := f(&b); err != nil {
			t.Fatalf("encode %s: %v", name, err)
		}
		out[name] = b.Bytes()
	}
	m := testImage(37, 23, false)
	ma := testImage(37, 23, true)
	enc("go.jpg", func(b *bytes.Buffer) error { return jpeg.Encode(b, m, &jpeg.Options{Quality: 90}) })
	enc("go.png", func(b *bytes.Buffer) error { return png.Encode(b, ma) })
	enc("go.gif", func(b *bytes.Buffer) error { return gif.Encode(b, m, nil) })
	enc("go.bmp", func(b *bytes.Buffer) error { return bmp.Encode(b, m) })
	enc("go.tif", func(b *bytes.Buffer) error { return tiff.Encode(b, ma, &tiff.Options{Compression: tiff.Deflate}) })
	ents, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if filepath.Ext(e.Name()) == ".json" || e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("testdata", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

// pngHeaderOnly is a PNG signature and a valid IHDR claiming w×h RGBA, with
// no pixel data: a decompression-bomb header.
func pngHeaderOnly(w, h uint32) []byte {
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], w)
	binary.BigEndian.PutUint32(ihdr[4:], h)
	ihdr[8], ihdr[9] = 8, 6
	return append([]byte("\x89PNG\r\n\x1a\n"), pngChunk("IHDR", ihdr)...)
}

func pngChunk(typ string, data []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(data)))
	b = append(b, typ...)
	b = append(b, data...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(append([]byte(typ), data...)))
}

// jpegWithExif inserts an APP1 Exif segment with the orientation after SOI.
func jpegWithExif(t testing.TB, jpg []byte, orientation uint16) []byte {
	t.Helper()
	tf := []byte("MM\x00\x2a\x00\x00\x00\x08\x00\x01")
	tf = append(tf, 0x01, 0x12, 0x00, 0x03, 0, 0, 0, 1)
	tf = binary.BigEndian.AppendUint16(tf, orientation)
	tf = append(tf, 0, 0, 0, 0, 0, 0)
	seg := append([]byte("Exif\x00\x00"), tf...)
	app1 := []byte{0xFF, 0xE1}
	app1 = binary.BigEndian.AppendUint16(app1, uint16(len(seg)+2))
	app1 = append(app1, seg...)
	out := append([]byte{}, jpg[:2]...)
	out = append(out, app1...)
	return append(out, jpg[2:]...)
}
