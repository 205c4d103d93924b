package balancer

import (
	"fmt"
	"html/template"
	"io"
	"net/http"
	"strings"
)

// WriteHTML writes a self-contained HTML page for r: the strategy comparison
// table and, per strategy, an inline SVG bar chart of per-rank cost for the
// first steps. No scripts, no external resources.
func WriteHTML(w io.Writer, r *Report) error {
	type row struct {
		Name string
		S    Summary
		Vs   float64
	}
	type chart struct {
		Title string
		SVG   template.HTML
	}
	var rows []row
	rnd := r.Strategies[StrategyRandom.String()].StepCostSum
	for _, s := range Strategies() {
		if sm, ok := r.Strategies[s.String()]; ok {
			vs := 0.0
			if sm.StepCostSum > 0 {
				vs = rnd / sm.StepCostSum
			}
			rows = append(rows, row{s.String(), sm, vs})
		}
	}
	var charts []chart
	top := 0.0
	for _, d := range r.Detail {
		for _, c := range d.RankCost {
			top = max(top, c)
		}
	}
	for _, d := range r.Detail {
		charts = append(charts, chart{
			Title: fmt.Sprintf("%s — step %d — max/mean %.4f", d.Strategy, d.Step, d.Imbalance),
			SVG:   template.HTML(barsSVG(d.RankCost, top)), // built from numbers only
		})
	}
	return pageTmpl.Execute(w, struct {
		R      *Report
		Rows   []row
		Charts []chart
	}{r, rows, charts})
}

// barsSVG draws one bar per rank scaled to top, with the mean as a line.
func barsSVG(costs []float64, top float64) string {
	const width, height, pad = 480.0, 120.0, 4.0
	if len(costs) == 0 || top <= 0 {
		return ""
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" role="img">`, width, height+pad)
	bw := width / float64(len(costs))
	var mean float64
	for i, c := range costs {
		h := height * c / top
		mean += c
		fmt.Fprintf(&sb, `<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="#4a78c2"><title>rank %d: %.6g</title></rect>`,
			float64(i)*bw+1, height-h+pad, max(bw-2, 1), h, i, c)
	}
	mean /= float64(len(costs))
	y := height - height*mean/top + pad
	fmt.Fprintf(&sb, `<line x1="0" x2="%g" y1="%.2f" y2="%.2f" stroke="#c0392b" stroke-dasharray="4 2"/></svg>`, width, y, y)
	return sb.String()
}

var pageTmpl = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mmfeed balance report</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse}td,th{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left}.charts{display:flex;flex-wrap:wrap;gap:1.5em}
figure{margin:0}figcaption{font-size:.85em;color:#555}
</style></head><body>
<h1>mmfeed balance report</h1>
<p>{{.R.Samples}} samples, {{.R.Quarantined}} quarantined, {{.R.Dropped}} dropped; {{.R.Steps}} steps on dp {{.R.DP}} × {{.R.MicroBatches}} micro-batches;
placement {{.R.Placement}}; lookahead {{.R.Lookahead}} (delay {{.R.MinDelay}}…{{.R.MaxDelay}} steps); cost unit {{.R.Unit}}.</p>
<p><strong>Speedup vs random: {{printf "%.3f" .R.SpeedupVsRandom}}×</strong></p>
<table><thead><tr><th>strategy</th><th>imbalance p50</th><th>p99</th><th>max</th><th>padding efficiency</th><th>Σ step cost</th><th>vs random</th></tr></thead><tbody>
{{range .Rows}}<tr><td>{{.Name}}</td><td>{{printf "%.4f" .S.ImbalanceP50}}</td><td>{{printf "%.4f" .S.ImbalanceP99}}</td><td>{{printf "%.4f" .S.ImbalanceMax}}</td><td>{{printf "%.4f" .S.PaddingEfficiency}}</td><td>{{printf "%.6g" .S.StepCostSum}}</td><td>{{printf "%.3f" .Vs}}×</td></tr>
{{end}}</tbody></table>
<h2>Per-rank cost (bars) and mean (dashed), first steps</h2>
<div class="charts">{{range .Charts}}<figure>{{.SVG}}<figcaption>{{.Title}}</figcaption></figure>{{end}}</div>
</body></html>
`))

// Handler serves the current report: HTML by default, JSON with ?format=json
// or an Accept: application/json header. report is called per request and may
// return nil while no report exists yet (503).
func Handler(report func() *Report) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r := report()
		if r == nil {
			http.Error(w, "no balance report yet", http.StatusServiceUnavailable)
			return
		}
		if req.URL.Query().Get("format") == "json" || strings.Contains(req.Header.Get("Accept"), "application/json") {
			w.Header().Set("Content-Type", "application/json")
			_ = r.WriteJSON(w)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_ = WriteHTML(w, r)
	})
}
