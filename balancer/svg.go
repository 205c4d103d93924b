package balancer

import (
	"fmt"
	"html/template"
	"math"
	"strings"
)

// The report's charts are SVG written here from numbers only (no user text
// except escaped labels), so the page needs no script library and renders the
// same in the static report.html and under serve.

// Okabe–Ito colours: distinguishable with the common colour-vision deficiencies.
const (
	colBlue      = "#0072B2"
	colVermilion = "#D55E00"
	colGreen     = "#009E73"
	colOrange    = "#E69F00"
	colSky       = "#56B4E9"
	colPurple    = "#CC79A7"
	colGrey      = "#555555"
)

// strategyStyle gives each strategy a colour and a dash pattern (readable in grey too).
func strategyStyle(name string) (colour, dash string) {
	switch name {
	case "mmfeed":
		return colBlue, ""
	case "random":
		return colVermilion, "6 3"
	case "length_grouped":
		return colGreen, "2 2"
	}
	return colGrey, "1 3"
}

// series is one line of a line chart.
type series struct {
	Name, Colour, Dash string
	X, Y               []float64
}

const chartW, chartH, marginL, marginB, marginT, marginR = 760.0, 200.0, 56.0, 28.0, 10.0, 140.0

// linesSVG draws series on shared axes with a legend on the right.
func linesSVG(ss []series, xLabel, yLabel string) template.HTML {
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		for i := range s.X {
			if !finite(s.Y[i]) {
				continue
			}
			xlo, xhi = min(xlo, s.X[i]), max(xhi, s.X[i])
			ylo, yhi = min(ylo, s.Y[i]), max(yhi, s.Y[i])
		}
	}
	if math.IsInf(xlo, 0) {
		return template.HTML(`<p class="empty">no data yet</p>`)
	}
	if yhi-ylo < 1e-9 {
		ylo, yhi = ylo-0.5*math.Max(math.Abs(ylo)*0.01, 1e-3), yhi+0.5*math.Max(math.Abs(yhi)*0.01, 1e-3)
	}
	pad := (yhi - ylo) * 0.05
	ylo, yhi = ylo-pad, yhi+pad
	if xhi == xlo {
		xhi = xlo + 1
	}
	w, h := chartW-marginL-marginR, chartH-marginT-marginB
	px := func(x float64) float64 { return marginL + w*(x-xlo)/(xhi-xlo) }
	py := func(y float64) float64 { return marginT + h*(1-(y-ylo)/(yhi-ylo)) }
	var sb strings.Builder
	svgOpen(&sb, chartW, chartH)
	axes(&sb, xlo, xhi, ylo, yhi, px, py, xLabel, yLabel, true)
	for i, s := range ss {
		var pts strings.Builder
		for j := range s.X {
			if finite(s.Y[j]) {
				fmt.Fprintf(&pts, "%.1f,%.1f ", px(s.X[j]), py(s.Y[j]))
			}
		}
		fmt.Fprintf(&sb, `<polyline fill="none" stroke="%s" stroke-width="1.6" stroke-dasharray="%s" points="%s"/>`, s.Colour, s.Dash, pts.String())
		if len(s.X) == 1 {
			fmt.Fprintf(&sb, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`, px(s.X[0]), py(s.Y[0]), s.Colour)
		}
		ly := marginT + 14 + 18*float64(i)
		lx := chartW - marginR + 10
		fmt.Fprintf(&sb, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="%s" stroke-width="2" stroke-dasharray="%s"/><text x="%.0f" y="%.0f">%s</text>`,
			lx, lx+22, ly-4, ly-4, s.Colour, s.Dash, lx+27, ly, template.HTMLEscapeString(s.Name))
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String())
}

func svgOpen(sb *strings.Builder, w, h float64) {
	fmt.Fprintf(sb, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %g %g" width="%g" height="%g" role="img" font-size="11" font-family="system-ui,sans-serif">`, w, h, w, h)
}

// axes draws the frame, 5 y ticks, up to 6 x ticks and the axis labels.
func axes(sb *strings.Builder, xlo, xhi, ylo, yhi float64, px, py func(float64) float64, xLabel, yLabel string, xTicks bool) {
	x0, x1, y0, y1 := px(xlo), px(xhi), py(ylo), py(yhi)
	fmt.Fprintf(sb, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#bbb"/>`, x0, y1, x1-x0, y0-y1)
	for i := 0; i <= 4; i++ {
		v := ylo + (yhi-ylo)*float64(i)/4
		fmt.Fprintf(sb, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="%.1f" y="%.1f" text-anchor="end">%s</text>`,
			x0, x1, py(v), py(v), x0-4, py(v)+4, tick(v, yhi-ylo))
	}
	for i := 0; i <= 5 && xTicks; i++ {
		v := xlo + (xhi-xlo)*float64(i)/5
		label := tick(v, xhi-xlo)
		if xhi-xlo >= 5 { // steps and observation counts: whole numbers
			v = math.Round(v)
			label = fmt.Sprintf("%.0f", v)
		}
		fmt.Fprintf(sb, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, px(v), y0+14, label)
	}
	fmt.Fprintf(sb, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="%s">%s</text>`, (x0+x1)/2, y0+27, colGrey, template.HTMLEscapeString(xLabel))
	fmt.Fprintf(sb, `<text x="12" y="%.1f" text-anchor="middle" fill="%s" transform="rotate(-90 12 %.1f)">%s</text>`, (y0+y1)/2, colGrey, (y0+y1)/2, template.HTMLEscapeString(yLabel))
}

// tick formats an axis value with as many decimals as the span needs.
func tick(v, span float64) string {
	switch {
	case span >= 20 || span == 0:
		return fmt.Sprintf("%.0f", v)
	case span >= 2:
		return fmt.Sprintf("%.1f", v)
	case span >= 0.2:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

// histogramSVG draws h's bins as bars with the range below.
func histogramSVG(h Histogram, label string) template.HTML {
	const w, ht, pad = 340.0, 120.0, 18.0
	most := 1
	for _, c := range h.Counts {
		most = max(most, c)
	}
	var sb strings.Builder
	svgOpen(&sb, w, ht+2*pad)
	bw := w / float64(max(len(h.Counts), 1))
	width := (h.Hi - h.Lo) / float64(max(len(h.Counts), 1))
	for i, c := range h.Counts {
		bh := ht * float64(c) / float64(most)
		fmt.Fprintf(&sb, `<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="%s"><title>%.4g–%.4g: %d</title></rect>`,
			float64(i)*bw+0.5, pad+ht-bh, max(bw-1, 0.5), bh, colBlue, h.Lo+width*float64(i), h.Lo+width*float64(i+1), c)
	}
	fmt.Fprintf(&sb, `<line x1="0" x2="%g" y1="%g" y2="%g" stroke="#999"/>`, w, pad+ht, pad+ht)
	fmt.Fprintf(&sb, `<text x="0" y="%g">%.4g</text><text x="%g" y="%g" text-anchor="end">%.4g</text><text x="%g" y="11" text-anchor="middle">%s (max bin %d)</text></svg>`,
		ht+2*pad-2, h.Lo, w, ht+2*pad-2, h.Hi, w/2, template.HTMLEscapeString(label), most)
	return template.HTML(sb.String())
}

// barGroup is one group of bars (one per value) in groupedBarsSVG.
type barGroup struct {
	Label  string
	Values []float64
}

// groupedBarsSVG draws groups of bars from zero, one colour per value position.
func groupedBarsSVG(groups []barGroup, names, colours []string, yLabel string) template.HTML {
	top := 0.0
	for _, g := range groups {
		for _, v := range g.Values {
			if finite(v) {
				top = max(top, v)
			}
		}
	}
	if len(groups) == 0 || top <= 0 {
		return template.HTML(`<p class="empty">no data yet</p>`)
	}
	top *= 1.08
	w, h := chartW-marginL-marginR, chartH-marginT-marginB
	py := func(y float64) float64 { return marginT + h*(1-y/top) }
	px := func(x float64) float64 { return marginL + w*x }
	var sb strings.Builder
	svgOpen(&sb, chartW, chartH)
	axes(&sb, 0, 1, 0, top, px, py, "dp rank", yLabel, false)
	gw := w / float64(len(groups))
	for i, g := range groups {
		bw := gw * 0.8 / float64(max(len(g.Values), 1))
		for j, v := range g.Values {
			if !finite(v) || v < 0 {
				continue
			}
			x := marginL + gw*float64(i) + gw*0.1 + bw*float64(j)
			fmt.Fprintf(&sb, `<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="%s"><title>%s %s: %.4g</title></rect>`,
				x, py(v), max(bw-1, 0.5), py(0)-py(v), colours[j%len(colours)], template.HTMLEscapeString(g.Label), names[j], v)
		}
		if len(groups) <= 32 {
			fmt.Fprintf(&sb, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, marginL+gw*(float64(i)+0.5), py(0)+14, template.HTMLEscapeString(g.Label))
		}
	}
	for j, n := range names {
		ly := marginT + 14 + 18*float64(j)
		lx := chartW - marginR + 10
		fmt.Fprintf(&sb, `<rect x="%.0f" y="%.0f" width="14" height="10" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`, lx, ly-10, colours[j%len(colours)], lx+20, ly, n)
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String())
}

// maxHeatCols and maxHeatRows bound a heatmap's cells; more steps (ranks)
// share a column (row), showing the largest relative cost among them.
const maxHeatCols, maxHeatRows = 480, 64

// heatmapSVG draws per-rank cost over the step's mean rank cost, ranks down
// and steps across, on a diverging scale 1−span … 1 … 1+span (blue: below
// the mean, white: at it, vermilion: above). A dark dot marks the slowest rank
// of each column.
func heatmapSVG(ds []StepDetail, span float64) template.HTML {
	if len(ds) == 0 || len(ds[0].RankCost) == 0 {
		return template.HTML(`<p class="empty">no steps</p>`)
	}
	ranks := len(ds[0].RankCost)
	cols, rows := min(len(ds), maxHeatCols), min(ranks, maxHeatRows)
	rel := make([][]float64, rows) // [row][col]
	for r := range rel {
		rel[r] = make([]float64, cols)
	}
	for k, d := range ds {
		c := k * cols / len(ds)
		mean := meanOf(d.RankCost)
		for rk, v := range d.RankCost {
			if rk >= ranks || mean <= 0 {
				continue
			}
			r := rk * rows / ranks
			rel[r][c] = max(rel[r][c], v/mean)
		}
	}
	const w, label = 760.0, 56.0
	cw := (w - label) / float64(cols)
	ch := math.Max(4, math.Min(16, 200/float64(rows)))
	var sb strings.Builder
	svgOpen(&sb, w, ch*float64(rows)+18)
	for r := range rows {
		if rows <= 16 || r%(rows/8) == 0 {
			fmt.Fprintf(&sb, `<text x="0" y="%.1f">rank %d</text>`, ch*float64(r)+ch-2, r*ranks/rows)
		}
	}
	for c := range cols {
		slow := 0
		for r := range rows {
			if rel[r][c] > rel[slow][c] {
				slow = r
			}
			fmt.Fprintf(&sb, `<rect x="%.2f" y="%.1f" width="%.2f" height="%.1f" fill="%s"/>`, label+cw*float64(c), ch*float64(r), cw+0.05, ch, divergingColour(rel[r][c], span))
		}
		fmt.Fprintf(&sb, `<circle cx="%.2f" cy="%.1f" r="%.2f" fill="#111"/>`, label+cw*(float64(c)+0.5), ch*(float64(slow)+0.5), math.Max(0.6, math.Min(cw, ch)*0.3))
	}
	first, last := ds[0].Step, ds[len(ds)-1].Step
	fmt.Fprintf(&sb, `<text x="%g" y="%.1f">step %d</text><text x="%g" y="%.1f" text-anchor="end">step %d</text></svg>`,
		label, ch*float64(rows)+14, first, w, ch*float64(rows)+14, last)
	return template.HTML(sb.String())
}

// heatLegendSVG draws the diverging scale.
func heatLegendSVG(span float64) template.HTML {
	var sb strings.Builder
	svgOpen(&sb, 330, 30)
	for i := range 60 {
		v := 1 - span + 2*span*float64(i)/59
		fmt.Fprintf(&sb, `<rect x="%d" y="0" width="5" height="12" fill="%s"/>`, 10+5*i, divergingColour(v, span))
	}
	fmt.Fprintf(&sb, `<text x="10" y="26">%.3f</text><text x="160" y="26" text-anchor="middle">1 (mean)</text><text x="310" y="26" text-anchor="end">%.3f</text></svg>`, 1-span, 1+span)
	return template.HTML(sb.String())
}

// divergingColour maps v in [1−span, 1+span] to blue–white–vermilion.
func divergingColour(v, span float64) string {
	t := 0.0
	if span > 0 {
		t = math.Max(-1, math.Min(1, (v-1)/span))
	}
	lerp := func(a, b [3]float64, f float64) string {
		return fmt.Sprintf("#%02x%02x%02x", int(a[0]+(b[0]-a[0])*f), int(a[1]+(b[1]-a[1])*f), int(a[2]+(b[2]-a[2])*f))
	}
	white := [3]float64{247, 247, 247}
	if t < 0 {
		return lerp(white, [3]float64{0, 114, 178}, -t)
	}
	return lerp(white, [3]float64{213, 94, 0}, t)
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// reduceMax keeps at most n points: each kept point is the largest y of a run
// of consecutive points (so a spike is never hidden).
func reduceMax(x, y []float64, n int) ([]float64, []float64) {
	if len(x) <= n {
		return x, y
	}
	ox, oy := make([]float64, 0, n), make([]float64, 0, n)
	for b := range n {
		lo, hi := b*len(x)/n, (b+1)*len(x)/n
		best := lo
		for i := lo; i < hi; i++ {
			if y[i] > y[best] {
				best = i
			}
		}
		ox, oy = append(ox, x[best]), append(oy, y[best])
	}
	return ox, oy
}
