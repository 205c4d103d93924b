package imgproc

import "math"

// geom is the resize-then-crop plan for one source size: resize the source
// to rw×rh, then keep the ow×oh window at (x0, y0).
type geom struct {
	rw, rh int
	x0, y0 int
	ow, oh int
}

// plan computes the geometry for a w×h (display-oriented) source. ok is
// false when w or h is not positive.
func (c Config) plan(w, h int) (g geom, ok bool) {
	if w <= 0 || h <= 0 {
		return geom{}, false
	}
	switch c.Policy {
	case PolicySquare:
		s := c.Size
		return geom{rw: s, rh: s, ow: s, oh: s}, true
	case PolicyDynamic:
		rh, rw := smartResize(h, w, c.PatchSize, c.MinPixels, c.MaxPixels)
		return geom{rw: rw, rh: rh, ow: rw, oh: rh}, true
	default:
		rw, rh := shorterSide(w, h, c.Size)
		g = geom{rw: rw, rh: rh, ow: c.Size, oh: c.Size}
		g.x0 = centreOffset(rw, c.Size)
		g.y0 = centreOffset(rh, c.Size)
		return g, true
	}
}

// shorterSide mirrors torchvision's _compute_resized_output_size for an int
// size: the shorter side becomes s, the longer int(s * long / short), with
// the division in float64 as Python's true division does.
func shorterSide(w, h, s int) (rw, rh int) {
	short, long := w, h
	if w > h {
		short, long = h, w
	}
	newLong := int(float64(s*long) / float64(short))
	if newLong < s { // cannot happen for long >= short; keep the crop valid
		newLong = s
	}
	if w <= h {
		return s, newLong
	}
	return newLong, s
}

// centreOffset is torchvision center_crop's int(round((n - s) / 2.0)),
// Python round being half to even.
func centreOffset(n, s int) int {
	return int(math.RoundToEven(float64(n-s) / 2.0))
}

// smartResize is Qwen2-VL's smart_resize with factor f: round both sides to
// multiples of f, then rescale into [minPx, maxPx] keeping the aspect ratio.
// Unlike the reference it never fails on extreme aspect ratios; each side is
// at least f, so the result may exceed maxPx for aspect ratios beyond
// maxPx/f².
func smartResize(h, w, f, minPx, maxPx int) (hb, wb int) {
	ff := float64(f)
	hb = max(f, int(math.RoundToEven(float64(h)/ff))*f)
	wb = max(f, int(math.RoundToEven(float64(w)/ff))*f)
	switch {
	case hb*wb > maxPx:
		beta := math.Sqrt(float64(h) * float64(w) / float64(maxPx))
		hb = max(f, int(math.Floor(float64(h)/beta/ff))*f)
		wb = max(f, int(math.Floor(float64(w)/beta/ff))*f)
	case hb*wb < minPx:
		beta := math.Sqrt(float64(minPx) / (float64(h) * float64(w)))
		hb = int(math.Ceil(float64(h)*beta/ff)) * f
		wb = int(math.Ceil(float64(w)*beta/ff)) * f
	}
	return min(hb, maxSide), min(wb, maxSide)
}

// OutputSize returns the output tensor's width and height for a source of
// w×h display pixels (use Header.Width/Height, which are already EXIF
// oriented). It returns 0, 0 for non-positive sizes.
func (c Config) OutputSize(w, h int) (ow, oh int) {
	g, ok := c.plan(w, h)
	if !ok {
		return 0, 0
	}
	return g.ow, g.oh
}

// Grid returns the patch grid [rows, cols] = [oh/PatchSize, ow/PatchSize]
// of the output for a w×h source.
func (c Config) Grid(w, h int) [2]int {
	ow, oh := c.OutputSize(w, h)
	if c.PatchSize < 1 {
		return [2]int{}
	}
	return [2]int{oh / c.PatchSize, ow / c.PatchSize}
}

// ImageTokens is the number of patches (rows*cols of Grid) the vision
// encoder sees for a w×h source; the planner uses it from headers alone.
func (c Config) ImageTokens(w, h int) int {
	g := c.Grid(w, h)
	return g[0] * g[1]
}
