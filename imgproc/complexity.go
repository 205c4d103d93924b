package imgproc

import "math"

// complexityGrid is the side of the gray thumbnail the pixel complexity is
// measured on.
const complexityGrid = 64

// pixelComplexity estimates content complexity in [0, 1] from packed RGB:
// the image is box-averaged to at most 64×64 luma (BT.601 weights), and the
// result is the mean forward-difference gradient magnitude divided by its
// maximum, 255·√2 (a saturated checkerboard thumbnail scores 1, a flat
// image 0).
func pixelComplexity(pix []byte, w, h int, buf []float32) (float64, []float32) {
	if w <= 0 || h <= 0 {
		return 0, buf
	}
	gw, gh := min(w, complexityGrid), min(h, complexityGrid)
	if cap(buf) < 2*gw*gh {
		buf = make([]float32, 2*gw*gh)
	}
	sum, cnt := buf[:gw*gh], buf[gw*gh:2*gw*gh]
	clear(sum)
	clear(cnt)
	for y := range h {
		gy := y * gh / h
		row := pix[3*y*w : 3*(y+1)*w]
		for x := range w {
			gx := x * gw / w
			p := row[3*x : 3*x+3]
			sum[gy*gw+gx] += 0.299*float32(p[0]) + 0.587*float32(p[1]) + 0.114*float32(p[2])
			cnt[gy*gw+gx]++
		}
	}
	for i := range sum {
		sum[i] /= cnt[i]
	}
	if gw < 2 && gh < 2 {
		return 0, buf
	}
	var total float64
	for y := range gh {
		for x := range gw {
			var dx, dy float64
			if gw > 1 { // forward difference, backward on the last column
				x0 := min(x, gw-2)
				dx = float64(sum[y*gw+x0+1] - sum[y*gw+x0])
			}
			if gh > 1 {
				y0 := min(y, gh-2)
				dy = float64(sum[(y0+1)*gw+x] - sum[y0*gw+x])
			}
			total += math.Hypot(dx, dy)
		}
	}
	c := total / float64(gw*gh) / (255 * math.Sqrt2)
	return min(max(c, 0), 1), buf
}
