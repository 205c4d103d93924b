package pipeline

import (
	"bytes"
	"image/jpeg"
	"testing"

	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/proto"
)

// TestJPEGWireLimitsAgree: what a worker passes through as a source JPEG
// (imgproc) is within what the batch accepts (proto), so no accepted source
// is refused on the wire.
func TestJPEGWireLimitsAgree(t *testing.T) {
	if imgproc.SourceJPEGMaxBytes != proto.MaxSourceJPEGBytes || imgproc.SourceJPEGMaxPixels != proto.MaxSourceJPEGPixels {
		t.Errorf("imgproc passes %d bytes / %d pixels through, proto accepts %d / %d",
			imgproc.SourceJPEGMaxBytes, imgproc.SourceJPEGMaxPixels, proto.MaxSourceJPEGBytes, proto.MaxSourceJPEGPixels)
	}
	if imgproc.DTypeJPEG != proto.DTypeJPEG || imgproc.DTypeJPEGSource != proto.DTypeJPEGSource {
		t.Errorf("dtype names differ: imgproc %q %q, proto %q %q", imgproc.DTypeJPEG, imgproc.DTypeJPEGSource, proto.DTypeJPEG, proto.DTypeJPEGSource)
	}
}

// TestPixelEncodingAndZeroPixels: only jpeg-source names a resize, and a
// failed sample's placeholder is a valid black JPEG under the JPEG dtypes
// (zeros of the tensor otherwise).
func TestPixelEncodingAndZeroPixels(t *testing.T) {
	for _, tc := range []struct {
		dtype, wantResize string
	}{
		{imgproc.DTypeFloat16, ""}, {imgproc.DTypeUint8, ""}, {imgproc.DTypeJPEG, ""},
		{imgproc.DTypeJPEGSource, "shorter-crop/bilinear"},
	} {
		c := imgproc.DefaultConfig()
		c.DType = tc.dtype
		if d, r := PixelEncoding(c); d != tc.dtype || r != tc.wantResize {
			t.Errorf("%s: PixelEncoding = %q %q, want %q %q", tc.dtype, d, r, tc.dtype, tc.wantResize)
		}
		z := zeroPixels(c, 16, 24)
		if !proto.IsJPEGDType(tc.dtype) {
			if len(z) != 3*16*24*c.ElemSize() || bytes.Count(z, []byte{0}) != len(z) {
				t.Errorf("%s: zero pixels are %d bytes, want %d zeros", tc.dtype, len(z), 3*16*24*c.ElemSize())
			}
			continue
		}
		m, err := jpeg.Decode(bytes.NewReader(z))
		if err != nil {
			t.Fatalf("%s: zero pixels are not a JPEG: %v", tc.dtype, err)
		}
		if b := m.Bounds(); b.Dx() != 24 || b.Dy() != 16 {
			t.Errorf("%s: zero JPEG is %v, want 24×16", tc.dtype, b)
		}
		if r, g, bl, _ := m.At(5, 5).RGBA(); r|g|bl > 0x0300 {
			t.Errorf("%s: zero JPEG pixel is %d,%d,%d, want black", tc.dtype, r>>8, g>>8, bl>>8)
		}
	}
}
