package imgproc

// DecodeReduce (Config.Decode) is the lossy fast path: DecodeFast's
// DCT-scaled JPEG decode, then a box reduction of the decoded RGB by whole
// factors (Pillow's Image.reduce, as resize(reducing_gap=2) and thumbnail()
// use it) before the antialiased resampler, so the resampler's work is
// bounded by a few times the output size instead of growing with the
// source's. Each output pixel of the reduction is the rounded mean of its
// fx×fy box (a partial box at the right or bottom edge averages the pixels
// it has).

// reduceGap is the reducing gap: the factors keep the reduced image at least
// reduceGap times the resize target on each axis (Pillow's thumbnail()
// default).
const reduceGap = 2

// reduceFactors is Pillow's resize(reducing_gap) rule for a w×h source
// resized to rw×rh: int(w / rw / gap) or 1 per axis.
func reduceFactors(w, h, rw, rh int) (fx, fy int) {
	fx = max(1, w/(reduceGap*max(rw, 1)))
	fy = max(1, h/(reduceGap*max(rh, 1)))
	return fx, fy
}

// boxReduce averages packed RGB src (w×h) over fx×fy boxes into dst and
// returns it with its size, ceil(w/fx)×ceil(h/fy).
func boxReduce(src []byte, w, h, fx, fy int, acc []uint32, dst []byte) ([]byte, []uint32, int, int) {
	ow, oh := (w+fx-1)/fx, (h+fy-1)/fy
	dst = grow(dst, 3*ow*oh)
	if cap(acc) < 3*w {
		acc = make([]uint32, 3*w)
	}
	acc = acc[:3*w]
	for oy := range oh {
		y0, y1 := oy*fy, min(oy*fy+fy, h)
		clear(acc)
		for y := y0; y < y1; y++ {
			for i, v := range src[3*w*y : 3*w*(y+1)] {
				acc[i] += uint32(v)
			}
		}
		out := dst[3*ow*oy : 3*ow*(oy+1)]
		for ox := range ow {
			x0, x1 := ox*fx, min(ox*fx+fx, w)
			n := uint32((x1 - x0) * (y1 - y0))
			var s0, s1, s2 uint32
			for a := acc[3*x0 : 3*x1]; len(a) >= 3; a = a[3:] {
				s0, s1, s2 = s0+a[0], s1+a[1], s2+a[2]
			}
			out[3*ox], out[3*ox+1], out[3*ox+2] = uint8((s0+n/2)/n), uint8((s1+n/2)/n), uint8((s2+n/2)/n)
		}
	}
	return dst, acc, ow, oh
}
