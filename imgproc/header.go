package imgproc

import (
	"bytes"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"math"

	"golang.org/x/image/bmp"
	"golang.org/x/image/tiff"
	"golang.org/x/image/webp"
)

// Supported formats, as reported in Header.Format and Image.Format.
const (
	FormatJPEG = "jpeg"
	FormatPNG  = "png"
	FormatGIF  = "gif"
	FormatWebP = "webp"
	FormatBMP  = "bmp"
	FormatTIFF = "tiff"
)

// Header is what the file header alone tells about an image.
type Header struct {
	// Format is one of the Format* constants, sniffed from the content.
	Format string
	// Width and Height are the display size: the stored size with the EXIF
	// orientation applied (swapped for orientations 5-8).
	Width, Height int
	// BitsPerPixel of the decoded colour model (8 gray or palette, 16 gray
	// 16-bit, 24 YCbCr, 32 RGBA/CMYK, 64 RGBA 16-bit).
	BitsPerPixel int
	// FileBytes is the input length.
	FileBytes int
	// Orientation is the EXIF orientation 1..8 (1 when absent or invalid).
	Orientation int
}

// Pixels is the number of pixels the decoder will allocate.
func (h Header) Pixels() int { return h.Width * h.Height }

// sniff identifies the format from magic bytes; "" when unknown.
func sniff(data []byte) string {
	switch {
	case len(data) >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF:
		return FormatJPEG
	case bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")):
		return FormatPNG
	case bytes.HasPrefix(data, []byte("GIF87a")), bytes.HasPrefix(data, []byte("GIF89a")):
		return FormatGIF
	case len(data) >= 12 && string(data[:4]) == "RIFF" && string(data[8:12]) == "WEBP":
		return FormatWebP
	case bytes.HasPrefix(data, []byte("BM")):
		return FormatBMP
	case bytes.HasPrefix(data, []byte("II*\x00")), bytes.HasPrefix(data, []byte("MM\x00*")):
		return FormatTIFF
	}
	return ""
}

// ReadHeader sniffs the format and parses only the header (image.DecodeConfig
// of the format's decoder, plus the EXIF orientation); it never allocates
// the pixel buffer, so it is safe on decompression bombs. It applies no
// limits: Processor.Process does.
func ReadHeader(data []byte) (Header, error) {
	if len(data) == 0 {
		return Header{}, ErrEmpty
	}
	format := sniff(data)
	if format == "" {
		return Header{}, fmt.Errorf("imgproc: not an image (content: %s): %w", contentKind(data), ErrUnsupported)
	}
	cfg, err := decodeConfig(format, data)
	if err != nil {
		return Header{}, err
	}
	if cfg.Width <= 0 || cfg.Height <= 0 {
		return Header{}, fmt.Errorf("imgproc: %s header: size %dx%d: %w", format, cfg.Width, cfg.Height, ErrCorrupt)
	}
	h := Header{
		Format:       format,
		Width:        cfg.Width,
		Height:       cfg.Height,
		BitsPerPixel: bitsPerPixel(cfg.ColorModel),
		FileBytes:    len(data),
		Orientation:  exifOrientation(format, data),
	}
	if h.Orientation >= 5 {
		h.Width, h.Height = h.Height, h.Width
	}
	return h, nil
}

func decodeConfig(format string, data []byte) (cfg image.Config, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("imgproc: %s header: panic: %v: %w", format, r, ErrCorrupt)
		}
	}()
	r := bytes.NewReader(data)
	switch format {
	case FormatJPEG:
		cfg, err = jpeg.DecodeConfig(r)
	case FormatPNG:
		cfg, err = png.DecodeConfig(r)
	case FormatGIF:
		cfg, err = gif.DecodeConfig(r)
	case FormatWebP:
		cfg, err = webp.DecodeConfig(r)
	case FormatBMP:
		cfg, err = bmp.DecodeConfig(r)
	case FormatTIFF:
		cfg, err = tiff.DecodeConfig(r)
	}
	if err != nil {
		return cfg, classify(format+" header", err)
	}
	return cfg, nil
}

// classify maps a decoder error onto ErrUnsupported or ErrCorrupt.
func classify(what string, err error) error {
	var (
		ju jpeg.UnsupportedError
		pu png.UnsupportedError
		tu tiff.UnsupportedError
	)
	switch {
	case errors.As(err, &ju), errors.As(err, &pu), errors.As(err, &tu), errors.Is(err, bmp.ErrUnsupported):
		return fmt.Errorf("imgproc: %s: %v: %w", what, err, ErrUnsupported)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("imgproc: %s: truncated: %v: %w", what, err, ErrCorrupt)
	}
	return fmt.Errorf("imgproc: %s: %v: %w", what, err, ErrCorrupt)
}

func bitsPerPixel(m color.Model) int {
	switch m {
	case color.GrayModel:
		return 8
	case color.Gray16Model:
		return 16
	case color.YCbCrModel:
		return 24
	case color.RGBAModel, color.NRGBAModel, color.CMYKModel, color.NYCbCrAModel:
		return 32
	case color.RGBA64Model, color.NRGBA64Model:
		return 64
	}
	if p, ok := m.(color.Palette); ok {
		return max(1, int(math.Ceil(math.Log2(float64(max(2, len(p)))))))
	}
	return 24
}

// HeaderComplexity is a cheap content-complexity estimate in [0, 1] from
// the header alone, for planning before decoding. It is the compressed
// density: for lossy formats (JPEG, WebP) 1-exp(-bpp/1.5) with bpp the file
// bits per pixel; for lossless formats 1-exp(-3r) with r the compressed to
// raw size ratio. Uncompressed formats (BMP) and invalid headers give 0.5.
// It is a prior, meant to be refined by Image.Complexity and the balancer's
// online calibration.
func HeaderComplexity(h Header) float64 {
	px := float64(h.Width) * float64(h.Height)
	if px <= 0 || h.FileBytes <= 0 {
		return 0.5
	}
	bpp := float64(h.FileBytes) * 8 / px
	switch h.Format {
	case FormatJPEG, FormatWebP:
		return 1 - math.Exp(-bpp/1.5)
	case FormatPNG, FormatGIF, FormatTIFF:
		raw := float64(max(h.BitsPerPixel, 1))
		return 1 - math.Exp(-3*math.Min(bpp/raw, 1))
	}
	return 0.5
}
