package imgproc

import "math"

// The resampler reproduces Pillow's Resample.c for 8-bit images: separable
// convolution in Pillow 13's pass order (see verticalFirst), coefficients
// computed in float64 and quantised to 22-bit fixed point, each pass rounded
// and clipped to uint8.
// On the same RGB input it gives byte-identical output to Image.resize.
// It computes only the output window kept by the crop.

const precisionBits = 32 - 8 - 2

type kernel struct {
	support float64
	fn      func(x float64) float64
}

var (
	bilinearKernel = kernel{support: 1, fn: func(x float64) float64 {
		x = math.Abs(x)
		if x < 1 {
			return 1 - x
		}
		return 0
	}}
	bicubicKernel = kernel{support: 2, fn: func(x float64) float64 {
		const a = -0.5
		x = math.Abs(x)
		// float64() conversions stop the compiler fusing into FMA, which
		// would round differently from Pillow's C build.
		if x < 1 {
			return float64(float64(float64((a+2)*x)-(a+3))*x)*x + 1
		}
		if x < 2 {
			return float64(float64(float64(float64(x-5)*x)+8)*x-4) * a
		}
		return 0
	}}
)

// coeffs holds the fixed-point taps of out[o0:o0+n] for an in→out resize.
type coeffs struct {
	ksize  int
	bounds []int32 // xmin, count per output
	k      []int32 // ksize taps per output
	fk     []float64
}

// compute mirrors Pillow's precompute_coeffs + normalize_coeffs_8bpc for the
// output indices [o0, o0+n) of a resize from inSize to outSize.
func (c *coeffs) compute(inSize, outSize, o0, n int, kern kernel) {
	scale := float64(inSize) / float64(outSize)
	filterscale := max(scale, 1.0)
	support := kern.support * filterscale
	c.ksize = int(math.Ceil(support))*2 + 1
	c.bounds = growI32(c.bounds, 2*n)
	c.k = growI32(c.k, n*c.ksize)
	if cap(c.fk) < c.ksize {
		c.fk = make([]float64, c.ksize)
	}
	fk := c.fk[:c.ksize]
	ss := 1.0 / filterscale
	for i := range n {
		center := float64(float64(o0+i)+0.5) * scale
		xmin := max(int(center-support+0.5), 0)
		xmax := min(int(center+support+0.5), inSize) - xmin
		xmax = min(xmax, c.ksize)
		ww := 0.0
		for x := range xmax {
			w := kern.fn(float64(float64(x+xmin)-center+0.5) * ss)
			fk[x] = w
			ww += w
		}
		k := c.k[i*c.ksize : (i+1)*c.ksize]
		for x := range c.ksize {
			v := 0.0
			if x < xmax {
				v = fk[x]
				if ww != 0 {
					v /= ww
				}
			}
			if v < 0 {
				k[x] = int32(-0.5 + v*(1<<precisionBits))
			} else {
				k[x] = int32(0.5 + v*(1<<precisionBits))
			}
		}
		c.bounds[2*i], c.bounds[2*i+1] = int32(xmin), int32(xmax)
	}
}

func clip8(v int32) uint8 {
	if v >= 1<<precisionBits<<8 {
		return 255
	}
	if v <= 0 {
		return 0
	}
	return uint8(v >> precisionBits)
}

func growI32(b []int32, n int) []int32 {
	if cap(b) < n {
		return make([]int32, n)
	}
	return b[:n]
}

// resampler holds reusable buffers; not safe for concurrent use.
type resampler struct {
	h, v coeffs
	tmp  []byte
	acc  []int32
}

// verticalFirst is Pillow 13's pass order rule (python-pillow/Pillow#9549):
// when the height shrinks by more than twice as many pixels as the width,
// the vertical pass runs first. Determined empirically against Pillow 13.0
// (zero mismatches over 267 random resizes, strict inequality at the tie).
func verticalFirst(w, h, rw, rh int) bool {
	return rh < h && 2*(w-rw) < h-rh
}

// resize resamples packed RGB src (w×h) to the window g of a g.rw×g.rh
// resize and writes g.ow×g.oh packed RGB into dst (len ≥ 3*ow*oh).
func (r *resampler) resize(src []byte, w, h int, g geom, kern kernel, dst []byte) {
	if verticalFirst(w, h, g.rw, g.rh) {
		r.resizeVH(src, w, h, g, kern, dst)
		return
	}
	needH := g.rw != w
	needV := g.rh != h
	// Rows of src the vertical pass reads.
	y0, y1 := g.y0, g.y0+g.oh
	if needV {
		r.v.compute(h, g.rh, g.y0, g.oh, kern)
		last := 2 * (g.oh - 1)
		y0 = int(r.v.bounds[0])
		y1 = int(r.v.bounds[last] + r.v.bounds[last+1])
	}
	// Horizontal pass: rows [y0, y1) of src → tmp (stride 3*ow), or a view.
	var mid []byte
	midStride, midOff := 3*g.ow, 0
	if needH {
		r.h.compute(w, g.rw, g.x0, g.ow, kern)
		r.tmp = grow(r.tmp, (y1-y0)*midStride)
		horizontal(src[y0*3*w:y1*3*w], 3*w, &r.h, g.ow, r.tmp)
		mid = r.tmp
	} else {
		mid, midStride, midOff = src[y0*3*w:y1*3*w], 3*w, 3*g.x0
	}
	if !needV {
		for y := range g.oh {
			copy(dst[y*3*g.ow:(y+1)*3*g.ow], mid[y*midStride+midOff:])
		}
		return
	}
	for i := range g.oh { // bounds relative to y0, as Pillow shifts them
		r.v.bounds[2*i] -= int32(y0)
	}
	r.acc = growI32(r.acc, 3*g.ow)
	vertical(mid, midStride, midOff, &r.v, g.ow, g.oh, r.acc, dst)
}

// resizeVH is resize with the vertical pass first, over only the source
// columns the horizontal pass will read.
func (r *resampler) resizeVH(src []byte, w, h int, g geom, kern kernel, dst []byte) {
	r.v.compute(h, g.rh, g.y0, g.oh, kern)
	x0, x1 := g.x0, g.x0+g.ow
	needH := g.rw != w
	if needH {
		r.h.compute(w, g.rw, g.x0, g.ow, kern)
		last := 2 * (g.ow - 1)
		x0 = int(r.h.bounds[0])
		x1 = int(r.h.bounds[last] + r.h.bounds[last+1])
	}
	n := x1 - x0
	r.acc = growI32(r.acc, 3*n)
	if !needH {
		vertical(src, 3*w, 3*x0, &r.v, n, g.oh, r.acc, dst)
		return
	}
	r.tmp = grow(r.tmp, 3*n*g.oh)
	vertical(src, 3*w, 3*x0, &r.v, n, g.oh, r.acc, r.tmp)
	for i := range g.ow { // bounds relative to x0
		r.h.bounds[2*i] -= int32(x0)
	}
	horizontal(r.tmp, 3*n, &r.h, g.ow, dst)
}

func horizontal(src []byte, stride int, c *coeffs, ow int, dst []byte) {
	rows := len(src) / stride
	ks := c.ksize
	for y := range rows {
		in := src[y*stride : (y+1)*stride]
		out := dst[y*3*ow : (y+1)*3*ow]
		for x := range ow {
			xmin, n := int(c.bounds[2*x]), int(c.bounds[2*x+1])
			k := c.k[x*ks : x*ks+n]
			p := in[3*xmin : 3*(xmin+n)]
			s0, s1, s2 := int32(1<<(precisionBits-1)), int32(1<<(precisionBits-1)), int32(1<<(precisionBits-1))
			for j, kv := range k {
				q := p[3*j : 3*j+3]
				s0 += int32(q[0]) * kv
				s1 += int32(q[1]) * kv
				s2 += int32(q[2]) * kv
			}
			out[3*x], out[3*x+1], out[3*x+2] = clip8(s0), clip8(s1), clip8(s2)
		}
	}
}

func vertical(src []byte, stride, off int, c *coeffs, ow, oh int, acc []int32, dst []byte) {
	ks := c.ksize
	n3 := 3 * ow
	acc = acc[:n3]
	for y := range oh {
		ymin, n := int(c.bounds[2*y]), int(c.bounds[2*y+1])
		for i := range acc {
			acc[i] = 1 << (precisionBits - 1)
		}
		for j, kv := range c.k[y*ks : y*ks+n] {
			row := src[(ymin+j)*stride+off:]
			row = row[:n3]
			for x, v := range row {
				acc[x] += int32(v) * kv
			}
		}
		out := dst[y*n3 : (y+1)*n3]
		for x, s := range acc {
			out[x] = clip8(s)
		}
	}
}
