package imgproc

import (
	"bytes"
	"fmt"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"

	"golang.org/x/image/bmp"
	"golang.org/x/image/tiff"
	"golang.org/x/image/webp"
)

// decodeImage runs the pure-Go decoder of the sniffed format. A panic in a
// decoder is recovered and reported as ErrCorrupt.
// For an animated WebP it decodes the first frame and returns its offset on
// the canvas; other formats report the image's own bounds origin.
func decodeImage(format string, data []byte) (img image.Image, off image.Point, err error) {
	defer func() {
		if r := recover(); r != nil {
			img, err = nil, fmt.Errorf("imgproc: decode %s: panic: %v: %w", format, r, ErrCorrupt)
		}
	}()
	r := bytes.NewReader(data)
	switch format {
	case FormatJPEG:
		img, err = jpeg.Decode(r)
	case FormatPNG:
		img, err = png.Decode(r)
	case FormatGIF:
		img, err = gif.Decode(r) // first frame
	case FormatWebP:
		if still, o, ok := webpFirstFrame(data); ok {
			if err := frameInCanvas(data, still, o); err != nil {
				return nil, off, err
			}
			r, off = bytes.NewReader(still), o
		}
		img, err = webp.Decode(r)
	case FormatBMP:
		img, err = bmp.Decode(r)
	case FormatTIFF:
		img, err = tiff.Decode(r) // first page
	default:
		return nil, off, fmt.Errorf("imgproc: decode %q: %w", format, ErrUnsupported)
	}
	if err != nil {
		return nil, off, classify("decode "+format, err)
	}
	return img, off.Add(img.Bounds().Min), nil
}

// decodeRGB decodes data to packed RGB in the stored orientation (rawW ×
// rawH from the header, or smaller when the fast JPEG path drafted it).
func (p *Processor) decodeRGB(data []byte, hdr Header, rawW, rawH int, g geom, s *scratch) ([]byte, int, int, error) {
	if hdr.Format == FormatJPEG && haveTurbo {
		tw, th := g.rw, g.rh
		if hdr.Orientation >= 5 {
			tw, th = th, tw
		}
		num, den := p.cfg.dctScale(rawW, rawH, tw, th)
		pix, w, h, ok, err := turboDecode(data, rawW, rawH, num, den, s)
		if err != nil || ok {
			return pix, w, h, err
		}
	}
	img, off, err := decodeImage(hdr.Format, data)
	if err != nil {
		return nil, 0, 0, err
	}
	b := img.Bounds().Sub(img.Bounds().Min).Add(off) // where the pixels go
	kind := yccJFIF
	if hdr.Format == FormatWebP {
		kind = yccVP8
	}
	s.rgb = toRGB(img, kind, p.cfg.Background, s.rgb)
	if b.Min.X == 0 && b.Min.Y == 0 && b.Dx() == rawW && b.Dy() == rawH {
		return s.rgb, rawW, rawH, nil
	}
	// A GIF or animated WebP frame smaller than its canvas: paste it on a
	// canvas of background colour (transparent, composited).
	canvas := grow(s.rot, 3*rawW*rawH)
	bg := p.cfg.Background
	for i := 0; i < len(canvas); i += 3 {
		canvas[i], canvas[i+1], canvas[i+2] = bg.R, bg.G, bg.B
	}
	r := b.Intersect(image.Rect(0, 0, rawW, rawH))
	for y := r.Min.Y; y < r.Max.Y; y++ {
		src := s.rgb[3*((y-b.Min.Y)*b.Dx()+r.Min.X-b.Min.X):]
		copy(canvas[3*(y*rawW+r.Min.X):3*(y*rawW+r.Max.X)], src)
	}
	s.rot, s.rgb = s.rgb, canvas
	return s.rgb, rawW, rawH, nil
}
