package balancer

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"strings"
)

// StepTimes is one strategy's measured training steps (the end-to-end benchmark): the
// wall time of each step (the slowest rank's), in seconds, and summary numbers.
type StepTimes struct {
	// Strategy names the plan the trainer ran ("mmfeed", "random", ...).
	Strategy string
	// Seconds holds one wall time per measured step, in step order.
	Seconds []float64
	// IdleFraction is the share of the ranks' step time spent waiting at collectives.
	IdleFraction float64
	// ImbalancePredicted and ImbalanceMeasured are mean max/mean rank cost per step,
	// from the cost model and from the ranks' own compute times.
	ImbalancePredicted, ImbalanceMeasured float64
}

// StepTimeGroup is one dataset's comparison of strategies.
type StepTimeGroup struct {
	// Title names the dataset and settings.
	Title string
	// Runs holds one entry per strategy; the first is the reference for ratios.
	Runs []StepTimes
}

// WriteStepTimesHTML writes a self-contained page comparing measured step times per
// strategy: a table (mean, p50, p99, ratio to the reference, idle, imbalance) and a
// histogram of step times per strategy on a common axis, per group. Empty runs are shown
// as such; non-finite times are skipped.
func WriteStepTimesHTML(w io.Writer, title string, groups []StepTimeGroup) error {
	type row struct {
		StepTimes
		N                    int
		Mean, P50, P99, Over float64
	}
	type group struct {
		Title string
		Rows  []row
		SVG   template.HTML
	}
	var gs []group
	for _, g := range groups {
		var rows []row
		top := 0.0
		for _, r := range g.Runs {
			s := finiteSorted(r.Seconds)
			rw := row{StepTimes: r, N: len(s), Mean: meanOf(s), P50: quantileOf(s, 0.5), P99: quantileOf(s, 0.99)}
			if len(s) > 0 {
				top = max(top, s[len(s)-1])
			}
			rows = append(rows, rw)
		}
		for i := range rows {
			if rows[i].Mean > 0 && len(rows) > 0 {
				rows[i].Over = rows[i].Mean / rows[0].Mean
			}
		}
		gs = append(gs, group{Title: g.Title, Rows: rows, SVG: template.HTML(histogramsSVG(g.Runs, top))}) // numbers only
	}
	return stepTimesTmpl.Execute(w, struct {
		Title  string
		Groups []group
	}{title, gs})
}

// histogramsSVG draws one row of 20 bins per run, bins over [0, top] seconds.
func histogramsSVG(runs []StepTimes, top float64) string {
	const bins, width, rowH, label = 20, 480.0, 60.0, 110.0
	if len(runs) == 0 || top <= 0 {
		return ""
	}
	var sb strings.Builder
	h := rowH*float64(len(runs)) + 16
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" role="img">`, width+label, h)
	bw := width / bins
	for i, r := range runs {
		counts := make([]int, bins)
		most := 1
		for _, v := range finiteSorted(r.Seconds) {
			b := min(int(v/top*bins), bins-1)
			counts[b]++
			most = max(most, counts[b])
		}
		y0 := float64(i) * rowH
		fmt.Fprintf(&sb, `<text x="0" y="%.1f" font-size="12">%s</text>`, y0+rowH/2, template.HTMLEscapeString(r.Strategy))
		for b, c := range counts {
			bh := (rowH - 8) * float64(c) / float64(most)
			fmt.Fprintf(&sb, `<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="#4a78c2"><title>%.0f–%.0f ms: %d steps</title></rect>`,
				label+float64(b)*bw+1, y0+rowH-4-bh, bw-2, bh, 1e3*top*float64(b)/bins, 1e3*top*float64(b+1)/bins, c)
		}
	}
	fmt.Fprintf(&sb, `<text x="%g" y="%g" font-size="11">0 ms</text><text x="%g" y="%g" font-size="11" text-anchor="end">%.0f ms</text></svg>`,
		label, h-2, label+width, h-2, 1e3*top)
	return sb.String()
}

func finiteSorted(v []float64) []float64 {
	out := make([]float64, 0, len(v))
	for _, x := range v {
		if !math.IsNaN(x) && !math.IsInf(x, 0) && x >= 0 {
			out = append(out, x)
		}
	}
	slices.Sort(out)
	return out
}

func meanOf(sorted []float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	var s float64
	for _, x := range sorted {
		s += x
	}
	return s / float64(len(sorted))
}

// quantileOf is the nearest-rank quantile of sorted values (0 when empty).
func quantileOf(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

var stepTimesTmpl = template.Must(template.New("steps").Funcs(template.FuncMap{
	"mul": func(v float64) float64 { return 1e3 * v },
	"pct": func(v float64) float64 { return 100 * v },
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse}td,th{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left}
</style></head><body>
<h1>{{.Title}}</h1>
{{range .Groups}}<h2>{{.Title}}</h2>
<table><thead><tr><th>strategy</th><th>steps</th><th>mean ms</th><th>p50 ms</th><th>p99 ms</th><th>mean / first mean</th><th>idle at collectives</th><th>imbalance predicted</th><th>imbalance measured</th></tr></thead><tbody>
{{range .Rows}}<tr><td>{{.Strategy}}</td><td>{{.N}}</td><td>{{printf "%.1f" (mul .Mean)}}</td><td>{{printf "%.1f" (mul .P50)}}</td><td>{{printf "%.1f" (mul .P99)}}</td><td>{{printf "%.3f" .Over}}×</td><td>{{printf "%.1f" (pct .IdleFraction)}}%</td><td>{{printf "%.3f" .ImbalancePredicted}}</td><td>{{printf "%.3f" .ImbalanceMeasured}}</td></tr>
{{end}}</tbody></table>
<p>Step-time distribution (slowest rank per step):</p>
{{.SVG}}
{{end}}</body></html>
`))
