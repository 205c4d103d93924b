package imgproc

import "image"

// Chroma upsampling that reproduces the reference decoders, so JPEG and WebP
// colours match Pillow (which uses libjpeg-turbo and libwebp): libjpeg's
// "fancy" triangle upsampling for h2v1, h1v2 and h2v2 (jdsample.c; plain
// replication when the chroma width is ≤ 2, as libjpeg does), and libwebp's
// fancy 9-3-3-1 upsampler (dsp/upsampling.c). Other ratios replicate.

// chromaRows fills cb and cr (len w) with the upsampled chroma of luma row y.
type chromaRows func(y int, cb, cr []byte)

func newChromaRows(m *image.YCbCr, kind yccKind) chromaRows {
	w, h := m.Rect.Dx(), m.Rect.Dy()
	cw := (w + 1) / 2
	ch := (h + 1) / 2
	row := func(p []byte, r int) []byte { return p[r*m.CStride : r*m.CStride+m.CStride] }
	far := func(y int) (near, far int) { // chroma rows nearest and next nearest to luma row y
		near = y >> 1
		far = near - 1
		if y&1 == 1 {
			far = near + 1
		}
		return near, min(max(far, 0), ch-1)
	}
	sub := m.SubsampleRatio
	if m.Rect.Min != (image.Point{}) {
		sub = -1 // sub-image offsets: keep the generic path
	}
	switch {
	case kind == yccVP8 && sub == image.YCbCrSubsampleRatio420:
		return func(y int, cb, cr []byte) {
			n, f := far(y)
			vp8FancyRow(row(m.Cb, n), row(m.Cb, f), cb)
			vp8FancyRow(row(m.Cr, n), row(m.Cr, f), cr)
		}
	case kind == yccJFIF && sub == image.YCbCrSubsampleRatio420 && cw > 2:
		return func(y int, cb, cr []byte) {
			n, f := far(y)
			jpegH2V2Row(row(m.Cb, n), row(m.Cb, f), cw, cb)
			jpegH2V2Row(row(m.Cr, n), row(m.Cr, f), cw, cr)
		}
	case kind == yccJFIF && sub == image.YCbCrSubsampleRatio422 && cw > 2:
		return func(y int, cb, cr []byte) {
			jpegH2V1Row(row(m.Cb, y), cw, cb)
			jpegH2V1Row(row(m.Cr, y), cw, cr)
		}
	case kind == yccJFIF && sub == image.YCbCrSubsampleRatio440:
		return func(y int, cb, cr []byte) {
			n, f := far(y)
			bias := int32(1)
			if y&1 == 1 {
				bias = 2
			}
			for x := range cb {
				cb[x] = uint8((3*int32(m.Cb[n*m.CStride+x]) + int32(m.Cb[f*m.CStride+x]) + bias) >> 2)
				cr[x] = uint8((3*int32(m.Cr[n*m.CStride+x]) + int32(m.Cr[f*m.CStride+x]) + bias) >> 2)
			}
		}
	}
	return func(y int, cb, cr []byte) {
		for x := range cb {
			ci := m.COffset(m.Rect.Min.X+x, m.Rect.Min.Y+y)
			cb[x], cr[x] = m.Cb[ci], m.Cr[ci]
		}
	}
}

// jpegH2V2Row is libjpeg's h2v2_fancy_upsample for one output row: n is the
// nearest chroma row, f the next nearest; even output columns round with
// +8, odd ones with +7 (libjpeg's ordered bias). Output is len(out) wide.
func jpegH2V2Row(n, f []byte, cw int, out []byte) {
	w := len(out)
	n, f = n[:cw], f[:cw]
	// Column sums 3*near + far, as libjpeg's lastcolsum/thiscolsum/nextcolsum.
	var last int32
	this := 3*int32(n[0]) + int32(f[0])
	for cx := range cw {
		next := this
		if cx+1 < cw {
			next = 3*int32(n[cx+1]) + int32(f[cx+1])
		}
		x := 2 * cx
		if x >= w {
			break
		}
		if cx == 0 {
			out[x] = uint8((this*4 + 8) >> 4)
		} else {
			out[x] = uint8((this*3 + last + 8) >> 4)
		}
		if x+1 < w {
			if cx == cw-1 {
				out[x+1] = uint8((this*4 + 7) >> 4)
			} else {
				out[x+1] = uint8((this*3 + next + 7) >> 4)
			}
		}
		last, this = this, next
	}
}

// jpegH2V1Row is libjpeg's h2v1_fancy_upsample.
func jpegH2V1Row(in []byte, cw int, out []byte) {
	for x := range out {
		cx := x >> 1
		v := int32(in[cx])
		switch {
		case x&1 == 0 && cx == 0, x&1 == 1 && cx == cw-1:
			out[x] = uint8(v)
		case x&1 == 0:
			out[x] = uint8((3*v + int32(in[cx-1]) + 1) >> 2)
		default:
			out[x] = uint8((3*v + int32(in[cx+1]) + 2) >> 2)
		}
	}
}

// vp8FancyRow is libwebp's UpsampleRgbLinePair for one output row with
// nearest chroma row n and next nearest f.
func vp8FancyRow(n, f []byte, out []byte) {
	w := len(out)
	out[0] = uint8((3*uint32(n[0]) + uint32(f[0]) + 2) >> 2)
	for x := 1; x <= (w-1)>>1; x++ {
		sum := uint32(n[x-1]) + uint32(n[x]) + uint32(f[x-1]) + uint32(f[x]) + 8
		out[2*x-1] = uint8((((sum + 2*(uint32(n[x])+uint32(f[x-1]))) >> 3) + uint32(n[x-1])) >> 1)
		out[2*x] = uint8((((sum + 2*(uint32(n[x-1])+uint32(f[x]))) >> 3) + uint32(n[x])) >> 1)
	}
	if w&1 == 0 {
		c := w/2 - 1
		out[w-1] = uint8((3*uint32(n[c]) + uint32(f[c]) + 2) >> 2)
	}
}
