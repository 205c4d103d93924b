package balancer

import "math"

// WorkCost is what a batch item's CPU time on a worker depends on, from
// the features alone (no decoding): megapixels to decode by format, the
// megabytes to read, and the samples (tokenizing, resizing to the output
// size, encoding).
type WorkCost [WorkDims]float64

const (
	WorkJPEGMP  = iota // megapixels of JPEG images (libjpeg-turbo)
	WorkOtherMP        // megapixels of the other formats (PNG, WebP, GIF, ...: Go or libwebp decoders)
	WorkMB             // encoded megabytes
	WorkSamples        // samples
	WorkDims
)

// WorkCostNames name the dimensions on /metrics and in WorkTimes.
var WorkCostNames = [WorkDims]string{"jpeg_mp", "other_mp", "mb", "sample"}

// workPrior weighs the dimensions before anything was measured: a
// megapixel of any format or a megabyte is one unit, a sample 0.05.
var workPrior = WorkCost{1, 1, 1, 0.05}

// Dot is x · c.
func (x WorkCost) Dot(c WorkCost) float64 {
	s := 0.0
	for i := range x {
		s += x[i] * c[i]
	}
	return s
}

// Units is the prior's cost of x: what heavy items are told by before
// anything was measured.
func (x WorkCost) Units() float64 { return x.Dot(workPrior) }

// WorkCostModel predicts an item's seconds on one worker core as a linear
// function of its WorkCost, fitted to the measured item times by ridge
// regression with exponential forgetting (recent items weigh more: the
// workers' machines and load change). The ridge pulls the coefficients
// toward the prior's shape scaled by the measured seconds per prior unit,
// so a handful of items already predicts, and a format or size mix the
// items never varied keeps the prior's proportions. Not safe for concurrent
// use (its owner holds its lock).
type WorkCostModel struct {
	n     int
	xtx   [WorkDims][WorkDims]float64
	xty   WorkCost
	secs  float64 // sum of measured seconds (forgotten alike)
	units float64 // sum of prior units of the same items
	coef  WorkCost
}

// workForget is the forgetting factor per observed item: the fit remembers
// about the last 1/(1-workForget) items.
const workForget = 0.995

// workRidge is the weight of the prior, in items' worth of evidence.
const workRidge = 4.0

// Observe adds one measured item.
func (m *WorkCostModel) Observe(x WorkCost, secs float64) {
	if secs <= 0 || x.Units() <= 0 {
		return
	}
	for i := range x {
		for j := range x {
			m.xtx[i][j] = workForget*m.xtx[i][j] + x[i]*x[j]
		}
		m.xty[i] = workForget*m.xty[i] + x[i]*secs
	}
	m.secs = workForget*m.secs + secs
	m.units = workForget*m.units + x.Units()
	m.n++
	m.solve()
}

// Fitted reports whether any item was measured.
func (m *WorkCostModel) Fitted() bool { return m.n > 0 }

// Coefficients returns the fitted seconds per unit of each dimension
// (zero before anything was measured).
func (m *WorkCostModel) Coefficients() WorkCost { return m.coef }

// Predict returns x's predicted seconds (0 before anything was measured).
func (m *WorkCostModel) Predict(x WorkCost) float64 {
	if m.n == 0 {
		return 0
	}
	return math.Max(x.Dot(m.coef), 0)
}

// solve refits the coefficients: (XᵀX + Λ) c = Xᵀy + Λ·p, with p the prior
// scaled to the measured seconds per unit and Λ diagonal, λᵢ = workRidge ×
// the mean xᵢ² of an item (so the prior weighs workRidge items whatever a
// dimension's scale, and a dimension no item had keeps its prior);
// negative coefficients are dropped and the rest refitted (a cost is never
// negative).
func (m *WorkCostModel) solve() {
	rate := m.secs / m.units
	var p, lambda WorkCost
	trace := 0.0
	for i := range WorkDims {
		trace += m.xtx[i][i]
	}
	items := max(1, math.Min(float64(m.n), 1/(1-workForget)))
	for i := range p {
		p[i] = rate * workPrior[i]
		lambda[i] = workRidge * max(m.xtx[i][i], 1e-6*trace) / items
	}
	active := [WorkDims]bool{}
	for i := range active {
		active[i] = true
	}
	for range WorkDims {
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
// others' coefficients are 0) with the package's least-squares solve
// (solveSubset); ok is false for a singular system.
func ridgeSolve(xtx [WorkDims][WorkDims]float64, xty, prior, lambda WorkCost, active [WorkDims]bool) (WorkCost, bool) {
	g := make([][]float64, WorkDims)
	b := make([]float64, WorkDims)
	for i := range g {
		g[i] = xtx[i][:]
		b[i] = xty[i] + lambda[i]*prior[i]
	}
	z, ok := solveSubset(g, b, lambda[:], active[:])
	var out WorkCost
	copy(out[:], z)
	return out, ok
}
