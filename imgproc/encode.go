package imgproc

import (
	"bytes"
	"fmt"
	"image"
	"image/jpeg"
)

// EncodeJPEG encodes a uint8 CHW RGB tensor (3×h×w bytes, what Process gives
// for DTypeUint8) as a baseline JPEG of the given quality (1..100). With
// libjpeg-turbo compiled in (build tag turbojpeg) chroma is kept at full
// resolution (4:4:4); the pure-Go encoder subsamples it (4:2:0), which costs
// PSNR on saturated edges. The shard store's jpeg mode uses it.
func EncodeJPEG(chw []byte, h, w, quality int) ([]byte, error) {
	if h <= 0 || w <= 0 || len(chw) != 3*h*w {
		return nil, fmt.Errorf("imgproc: encode jpeg: %d bytes for 3×%d×%d: %w", len(chw), h, w, ErrConfig)
	}
	plane := h * w
	rgb := make([]byte, 3*plane)
	for i := range plane {
		rgb[3*i], rgb[3*i+1], rgb[3*i+2] = chw[i], chw[plane+i], chw[2*plane+i]
	}
	return encodeRGB(rgb, h, w, quality)
}

// encodeRGB is EncodeJPEG of packed RGB pixels (stride 3*w): the same
// bytes for the same pixels.
func encodeRGB(rgb []byte, h, w, quality int) ([]byte, error) {
	if h <= 0 || w <= 0 || len(rgb) != 3*h*w {
		return nil, fmt.Errorf("imgproc: encode jpeg: %d bytes for %d×%d×3: %w", len(rgb), h, w, ErrConfig)
	}
	if quality < 1 || quality > 100 {
		return nil, fmt.Errorf("imgproc: encode jpeg: quality %d not in [1,100]: %w", quality, ErrConfig)
	}
	if b, ok, err := turboEncode(rgb, h, w, quality); ok || err != nil {
		return b, err
	}
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := range h * w {
		img.Pix[4*i], img.Pix[4*i+1], img.Pix[4*i+2], img.Pix[4*i+3] = rgb[3*i], rgb[3*i+1], rgb[3*i+2], 0xff
	}
	var buf bytes.Buffer
	buf.Grow(h * w / 2)
	if err := jpeg.Encode(&buf, img, &jpeg.Options{Quality: quality}); err != nil {
		return nil, fmt.Errorf("imgproc: encode jpeg: %w", err)
	}
	return buf.Bytes(), nil
}
