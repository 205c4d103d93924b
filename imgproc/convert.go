package imgproc

import (
	"image"
	"image/color"
)

// yccKind selects the YCbCr to RGB conversion of a decoder's output.
type yccKind int

const (
	yccJFIF yccKind = iota // JPEG: full-range BT.601, libjpeg's fixed point
	yccVP8                 // WebP lossy: limited-range BT.601, libwebp's fixed point
)

// libjpeg jdcolor.c tables (SCALEBITS 16), so JPEG colours match libjpeg.
var jCrR, jCbB, jCrG, jCbG [256]int32

func init() {
	fix := func(x float64) int32 { return int32(x*65536 + 0.5) }
	for i := range 256 {
		x := int32(i - 128)
		jCrR[i] = (fix(1.40200)*x + 1<<15) >> 16
		jCbB[i] = (fix(1.77200)*x + 1<<15) >> 16
		jCrG[i] = -fix(0.71414) * x
		jCbG[i] = -fix(0.34414)*x + 1<<15
	}
}

func clampU8(v int32) uint8 {
	if uint32(v) <= 255 {
		return uint8(v)
	}
	if v < 0 {
		return 0
	}
	return 255
}

func jfixRGB(y, cb, cr uint8) (r, g, b uint8) {
	yy := int32(y)
	return clampU8(yy + jCrR[cr]), clampU8(yy + (jCbG[cb]+jCrG[cr])>>16), clampU8(yy + jCbB[cb])
}

// libwebp dsp/yuv.h (YUV_FIX2 = 6).
func vp8Clip(v int32) uint8 {
	if v&^(256<<6-1) == 0 {
		return uint8(v >> 6)
	}
	if v < 0 {
		return 0
	}
	return 255
}

func vp8RGB(y, u, v uint8) (r, g, b uint8) {
	mh := func(a uint8, c int32) int32 { return (int32(a) * c) >> 8 }
	yy := mh(y, 19077)
	return vp8Clip(yy + mh(v, 26149) - 14234),
		vp8Clip(yy - mh(u, 6419) - mh(v, 13320) + 8708),
		vp8Clip(yy + mh(u, 33050) - 17685)
}

// composite blends a non-premultiplied 8-bit colour over the opaque
// background: (c*a + bg*(255-a) + 127) / 255, the formula the Python peer
// uses too.
func composite(c, a, bg uint8) uint8 {
	return uint8((uint32(c)*uint32(a) + uint32(bg)*(255-uint32(a)) + 127) / 255)
}

// toRGB converts a decoded image to packed 8-bit RGB (stride 3*w), reusing
// dst's capacity. Alpha is composited over bg; 16-bit samples keep their
// high byte; CMYK uses Pillow's (255-C)(255-K)/255.
func toRGB(img image.Image, kind yccKind, bg color.NRGBA, dst []byte) []byte {
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	dst = grow(dst, w*h*3)
	switch m := img.(type) {
	case *image.YCbCr:
		yccToRGB(m, nil, kind, bg, dst)
	case *image.NYCbCrA:
		yccToRGB(&m.YCbCr, m, kind, bg, dst)
	case *image.Gray:
		for y := range h {
			row := m.Pix[y*m.Stride : y*m.Stride+w]
			out := dst[y*w*3 : (y+1)*w*3]
			for x, v := range row {
				out[3*x], out[3*x+1], out[3*x+2] = v, v, v
			}
		}
	case *image.Gray16:
		for y := range h {
			row := m.Pix[y*m.Stride : y*m.Stride+2*w]
			out := dst[y*w*3 : (y+1)*w*3]
			for x := range w {
				v := row[2*x]
				out[3*x], out[3*x+1], out[3*x+2] = v, v, v
			}
		}
	case *image.NRGBA:
		nrgbaRows(m.Pix, m.Stride, w, h, bg, dst)
	case *image.RGBA:
		rgbaRows(m.Pix, m.Stride, 4, w, h, true, bg, dst)
	case *image.NRGBA64:
		rgbaRows(m.Pix, m.Stride, 8, w, h, false, bg, dst)
	case *image.RGBA64:
		rgbaRows(m.Pix, m.Stride, 8, w, h, true, bg, dst)
	case *image.Paletted:
		palettedToRGB(m, bg, dst)
	case *image.CMYK:
		for y := range h {
			row := m.Pix[y*m.Stride : y*m.Stride+4*w]
			out := dst[y*w*3 : (y+1)*w*3]
			for x := range w {
				nk := 255 - uint32(row[4*x+3])
				for c := range 3 {
					out[3*x+c] = uint8(nk - (uint32(row[4*x+c])*nk+128+((uint32(row[4*x+c])*nk+128)>>8))>>8)
				}
			}
		}
	default:
		genericToRGB(img, bg, dst)
	}
	return dst
}

// nrgbaRows is the common 8-bit non-premultiplied case of rgbaRows.
func nrgbaRows(pix []byte, stride, w, h int, bg color.NRGBA, dst []byte) {
	for y := range h {
		row := pix[y*stride : y*stride+4*w]
		out := dst[y*w*3 : (y+1)*w*3]
		for len(row) >= 4 && len(out) >= 3 {
			if a := row[3]; a == 255 {
				out[0], out[1], out[2] = row[0], row[1], row[2]
			} else {
				out[0], out[1], out[2] = composite(row[0], a, bg.R), composite(row[1], a, bg.G), composite(row[2], a, bg.B)
			}
			row, out = row[4:], out[3:]
		}
	}
}

// rgbaRows handles 4-channel 8-bit (step 4) or 16-bit big-endian (step 8)
// pixels, premultiplied or not; 16-bit samples use their high byte.
func rgbaRows(pix []byte, stride, step, w, h int, premul bool, bg color.NRGBA, dst []byte) {
	hi := step / 4 // byte distance between channels
	bgc := [3]uint8{bg.R, bg.G, bg.B}
	for y := range h {
		row := pix[y*stride : y*stride+step*w]
		out := dst[y*w*3 : (y+1)*w*3]
		for x := range w {
			p := row[step*x : step*x+step]
			a := p[3*hi]
			for c := range 3 {
				v := p[c*hi]
				switch {
				case a == 255:
					out[3*x+c] = v
				case premul:
					out[3*x+c] = uint8(min(255, uint32(v)+(uint32(bgc[c])*(255-uint32(a))+127)/255))
				default:
					out[3*x+c] = composite(v, a, bgc[c])
				}
			}
		}
	}
}

func palettedToRGB(m *image.Paletted, bg color.NRGBA, dst []byte) {
	var lut [256][3]uint8
	for i := range lut { // indices past the palette decode as black, like Go's At
		lut[i] = [3]uint8{composite(0, 255, bg.R), composite(0, 255, bg.G), composite(0, 255, bg.B)}
	}
	for i, c := range m.Palette {
		if i >= 256 {
			break
		}
		n := color.NRGBAModel.Convert(c).(color.NRGBA)
		lut[i] = [3]uint8{composite(n.R, n.A, bg.R), composite(n.G, n.A, bg.G), composite(n.B, n.A, bg.B)}
	}
	w, h := m.Rect.Dx(), m.Rect.Dy()
	for y := range h {
		row := m.Pix[y*m.Stride : y*m.Stride+w]
		out := dst[y*w*3 : (y+1)*w*3]
		for x, v := range row {
			out[3*x], out[3*x+1], out[3*x+2] = lut[v][0], lut[v][1], lut[v][2]
		}
	}
}

func genericToRGB(img image.Image, bg color.NRGBA, dst []byte) {
	b := img.Bounds()
	w := b.Dx()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		out := dst[(y-b.Min.Y)*w*3:]
		for x := b.Min.X; x < b.Max.X; x++ {
			n := color.NRGBA64Model.Convert(img.At(x, y)).(color.NRGBA64)
			a := uint8(n.A >> 8)
			i := 3 * (x - b.Min.X)
			out[i] = composite(uint8(n.R>>8), a, bg.R)
			out[i+1] = composite(uint8(n.G>>8), a, bg.G)
			out[i+2] = composite(uint8(n.B>>8), a, bg.B)
		}
	}
}

// yccToRGB converts planar YCbCr with the reference decoders' chroma
// upsampling (see upsample.go) and an optional alpha plane.
func yccToRGB(m *image.YCbCr, alpha *image.NYCbCrA, kind yccKind, bg color.NRGBA, dst []byte) {
	w, h := m.Rect.Dx(), m.Rect.Dy()
	conv := jfixRGB
	if kind == yccVP8 {
		conv = vp8RGB
	}
	rows := newChromaRows(m, kind)
	cb, cr := make([]byte, w), make([]byte, w)
	for y := range h {
		out := dst[y*w*3 : (y+1)*w*3]
		yrow := m.Y[y*m.YStride : y*m.YStride+w]
		rows(y, cb, cr)
		for x, yv := range yrow {
			r, g, bl := conv(yv, cb[x], cr[x])
			if alpha != nil {
				a := alpha.A[y*alpha.AStride+x]
				r, g, bl = composite(r, a, bg.R), composite(g, a, bg.G), composite(bl, a, bg.B)
			}
			out[3*x], out[3*x+1], out[3*x+2] = r, g, bl
		}
	}
}

// grow returns b resized to n bytes, reallocating only when too small.
func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}
