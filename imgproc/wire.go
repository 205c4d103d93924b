package imgproc

import "fmt"

// JPEG wire encodings (Config.DType). Both are lossy and opt-in: the exact
// dtypes above stay the default and bit-identical.
const (
	// DTypeJPEG: the resized, cropped RGB image (what DTypeUint8 gives)
	// re-encoded as a baseline JPEG of WireJPEGQuality, 4:4:4 with
	// libjpeg-turbo (like the shard's --store jpeg). The trainer decodes it
	// to uint8 and normalizes with Mean/Std.
	DTypeJPEG = "jpeg"
	// DTypeJPEGSource: the source file's own bytes when it is an acceptable
	// JPEG (SourceJPEGAcceptable), which the trainer decodes and resizes to
	// the planned Shape itself; any other source falls back to the DTypeJPEG
	// encoding at the planned size (Image.Source false).
	DTypeJPEGSource = "jpeg-source"
)

// WireJPEGQuality is the quality of DTypeJPEG images and of the
// DTypeJPEGSource fallback (the shard store's default).
const WireJPEGQuality = 95

// Limits of a source JPEG passed through as it is (DTypeJPEGSource); the
// trainer enforces the same before it decodes (proto.MaxSourceJPEGBytes,
// proto.MaxSourceJPEGPixels).
const (
	SourceJPEGMaxBytes  = 1 << 20
	SourceJPEGMaxPixels = 1 << 22
)

// IsJPEGWire reports whether dtype is one of the JPEG wire encodings.
func IsJPEGWire(dtype string) bool { return dtype == DTypeJPEG || dtype == DTypeJPEGSource }

// pixelDType is the tensor the processor computes before any JPEG encoding.
func (c Config) pixelDType() string {
	if IsJPEGWire(c.DType) {
		return DTypeUint8
	}
	return c.DType
}

// SourceJPEGAcceptable reports whether a source of header h may travel as
// its own bytes: a JPEG that Go's decoder reads (baseline or progressive,
// 8-bit; torchvision decodes these too), gray or YCbCr (not CMYK/YCCK),
// without an EXIF rotation, at most SourceJPEGMaxBytes and
// SourceJPEGMaxPixels.
func SourceJPEGAcceptable(h Header) bool {
	return h.Format == FormatJPEG && (h.BitsPerPixel == 8 || h.BitsPerPixel == 24) && h.Orientation == 1 &&
		h.FileBytes <= SourceJPEGMaxBytes && h.Width*h.Height <= SourceJPEGMaxPixels
}

// sourceImage is the DTypeJPEGSource image of an acceptable source: its
// bytes as they are, with the shape and grid the plan priced.
func (p *Processor) sourceImage(data []byte, hdr Header) Image {
	g, _ := p.cfg.plan(hdr.Width, hdr.Height)
	return Image{Data: data, DType: p.cfg.DType, Shape: [3]int{3, g.oh, g.ow},
		Grid: [2]int{g.oh / p.cfg.PatchSize, g.ow / p.cfg.PatchSize}, Mean: p.mean, Std: p.std,
		Complexity: HeaderComplexity(hdr), SrcWidth: hdr.Width, SrcHeight: hdr.Height, Format: hdr.Format, Source: true}
}

// wireEncode sets img.Data to the JPEG of rgb, the packed RGB pixels of
// img.Shape, for the JPEG wire dtypes.
func (p *Processor) wireEncode(img Image, rgb []byte) (Image, error) {
	b, err := encodeRGB(rgb, img.Shape[1], img.Shape[2], WireJPEGQuality)
	if err != nil {
		return Image{}, fmt.Errorf("imgproc: %s wire: %w", p.cfg.DType, err)
	}
	img.Data, img.DType = b, p.cfg.DType
	return img, nil
}

// ZeroJPEG is the JPEG of a black 3×h×w image: the pixels of a failed
// sample's placeholder row under the JPEG wire dtypes.
func ZeroJPEG(h, w int) ([]byte, error) {
	return EncodeJPEG(make([]byte, 3*h*w), h, w, WireJPEGQuality)
}
