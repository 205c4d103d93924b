package serve

import (
	"math"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/pipeline"
)

// itemCost is what a batch item's CPU time on a worker depends on, from
// the features alone (no decoding): megapixels to decode by format, the
// megabytes to read, and the samples (tokenizing, resizing to the output
// size, encoding).
type itemCost [costDims]float64

const (
	costJPEGMP  = iota // megapixels of JPEG images (libjpeg-turbo)
	costOtherMP        // megapixels of the other formats (PNG, WebP, GIF, ...: Go or libwebp decoders)
	costMB             // encoded megabytes
	costSamples        // samples
	costDims
)

// costNames name the dimensions on /metrics and in WorkTimes.
var costNames = [costDims]string{"jpeg_mp", "other_mp", "mb", "sample"}

// costPrior weighs the dimensions before anything was measured: a
// megapixel of any format or a megabyte is one unit, a sample 0.05.
var costPrior = itemCost{1, 1, 1, 0.05}

// costOf is the cost vector of entries of f.
func costOf(f *pipeline.Features, mb []balancer.Entry) itemCost {
	var x itemCost
	for _, e := range mb {
		sz := f.Sizes[e.Item]
		mp := float64(sz.X) * float64(sz.Y) / 1e6
		if f.Format(int(e.Item)) == imgproc.FormatJPEG {
			x[costJPEGMP] += mp
		} else {
			x[costOtherMP] += mp
		}
		x[costMB] += float64(f.ImageSize(int(e.Item))) / 1e6
		x[costSamples]++
	}
	return x
}

func (x itemCost) dot(c itemCost) float64 {
	s := 0.0
	for i := range x {
		s += x[i] * c[i]
	}
	return s
}

// units is the prior's cost of x: what heavy items are told by before
// anything was measured.
func (x itemCost) units() float64 { return x.dot(costPrior) }

// workCostModel predicts an item's seconds on one worker core as a linear
// function of its itemCost, fitted to the measured item times by ridge
// regression with exponential forgetting (recent items weigh more: the
// workers' machines and load change). The ridge pulls the coefficients
// toward the prior's shape scaled by the measured seconds per prior unit,
// so a handful of items already predicts, and a format or size mix the
// items never varied keeps the prior's proportions. Not safe for concurrent
// use (workPlanner holds its lock).
type workCostModel struct {
	n     int
	xtx   [costDims][costDims]float64
	xty   itemCost
	secs  float64 // sum of measured seconds (forgotten alike)
	units float64 // sum of prior units of the same items
	coef  itemCost
}

// costForget is the forgetting factor per observed item: the fit remembers
// about the last 1/(1-costForget) items.
const costForget = 0.995

// costRidge is the weight of the prior, in items' worth of evidence.
const costRidge = 4.0

// observe adds one measured item.
func (m *workCostModel) observe(x itemCost, secs float64) {
	if secs <= 0 || x.units() <= 0 {
		return
	}
	for i := range x {
		for j := range x {
			m.xtx[i][j] = costForget*m.xtx[i][j] + x[i]*x[j]
		}
		m.xty[i] = costForget*m.xty[i] + x[i]*secs
	}
	m.secs = costForget*m.secs + secs
	m.units = costForget*m.units + x.units()
	m.n++
	m.solve()
}

// fitted reports whether any item was measured.
func (m *workCostModel) fitted() bool { return m.n > 0 }

// predict returns x's predicted seconds (0 before anything was measured).
func (m *workCostModel) predict(x itemCost) float64 {
	if m.n == 0 {
		return 0
	}
	return math.Max(x.dot(m.coef), 0)
}

// solve refits the coefficients: (XᵀX + Λ) c = Xᵀy + Λ·p, with p the prior
// scaled to the measured seconds per unit and Λ diagonal, λᵢ = costRidge ×
// the mean xᵢ² of an item (so the prior weighs costRidge items whatever a
// dimension's scale, and a dimension no item had keeps its prior);
// negative coefficients are dropped and the rest refitted (a cost is never
// negative).
func (m *workCostModel) solve() {
	rate := m.secs / m.units
	var p, lambda itemCost
	trace := 0.0
	for i := range costDims {
		trace += m.xtx[i][i]
	}
	items := max(1, math.Min(float64(m.n), 1/(1-costForget)))
	for i := range p {
		p[i] = rate * costPrior[i]
		lambda[i] = costRidge * max(m.xtx[i][i], 1e-6*trace) / items
	}
	active := [costDims]bool{}
	for i := range active {
		active[i] = true
	}
	for range costDims {
		c, ok := ridgeSolve(m.xtx, m.xty, p, lambda, active)
		if !ok {
			m.coef = p
			return
		}
		neg := false
		for i := range c {
			if active[i] && c[i] < 0 {
				active[i], neg = false, true
			}
		}
		m.coef = c
		if !neg {
			return
		}
	}
}

// ridgeSolve solves the ridge system over the active dimensions (the
// others' coefficients are 0) by Gaussian elimination with partial
// pivoting; ok is false for a singular system.
func ridgeSolve(xtx [costDims][costDims]float64, xty, prior, lambda itemCost, active [costDims]bool) (itemCost, bool) {
	var idx []int
	for i, a := range active {
		if a {
			idx = append(idx, i)
		}
	}
	k := len(idx)
	a := make([][]float64, k)
	for r, i := range idx {
		a[r] = make([]float64, k+1)
		for c, j := range idx {
			a[r][c] = xtx[i][j]
		}
		a[r][r] += lambda[i]
		a[r][k] = xty[i] + lambda[i]*prior[i]
	}
	for col := range k {
		piv := col
		for r := col + 1; r < k; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[piv][col]) {
				piv = r
			}
		}
		if math.Abs(a[piv][col]) < 1e-300 {
			return itemCost{}, false
		}
		a[col], a[piv] = a[piv], a[col]
		for r := range k {
			if r == col {
				continue
			}
			f := a[r][col] / a[col][col]
			for c := col; c <= k; c++ {
				a[r][c] -= f * a[col][c]
			}
		}
	}
	var out itemCost
	for r, i := range idx {
		out[i] = a[r][k] / a[r][r]
	}
	return out, true
}
