package balancer

import (
	"encoding/base64"
	"fmt"
	"html/template"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
)

// WriteHTML writes the static balance report page for r: the strategy table,
// every step (a heatmap of per-rank cost over the step mean, imbalance and
// compute efficiency over steps, per strategy), histograms of the samples,
// thumbnails of the samples that drive cost, and quarantine by reason. It is
// self-contained: no scripts, no external resources (thumbnails are data URLs).
func WriteHTML(w io.Writer, r *Report) error {
	return WritePage(w, r, nil, "")
}

// WritePage writes the report page with, when live is not nil, its live
// section; with pollURL set, a small inline script replaces that section with
// the HTML fragment at pollURL every two seconds (WriteLiveHTML), so the page
// updates without reloading. Every number a reader compares with the JSON
// report carries data-key, its path in that JSON (see docs/report.md).
func WritePage(w io.Writer, r *Report, live *LiveView, pollURL string) error {
	d := pageData{R: r, Live: live, Poll: pollURL}
	d.Rows = strategyRows(r)
	d.Steps = stepSections(r)
	d.Hists = histograms(r)
	d.Quarantine = quarantineRows(r)
	for _, t := range r.Thumbnails {
		d.Thumbs = append(d.Thumbs, thumb{t, template.URL("data:" + safeMIME(t.MIME) + ";base64," + base64.StdEncoding.EncodeToString(t.Image))})
	}
	if live != nil {
		d.LiveHTML = renderLive(live)
	}
	return pageTmpl.Execute(w, d)
}

type pageData struct {
	R          *Report
	Live       *LiveView
	LiveHTML   template.HTML
	Poll       string
	Rows       []strategyRow
	Steps      stepsView
	Hists      []histView
	Quarantine []quarantineRow
	Thumbs     []thumb
}

type strategyRow struct {
	Name string
	S    Summary
	Vs   float64
}

type stepsView struct {
	Shown, Total int
	Span         float64
	Legend       template.HTML
	Heatmaps     []heatmapView
	Imbalance    template.HTML
	Efficiency   template.HTML
}

type heatmapView struct {
	Strategy string
	SVG      template.HTML
}

type histView struct {
	Key, Title string
	H          Histogram
	SVG        template.HTML
}

type quarantineRow struct {
	Reason   string
	Count    int64
	Examples string
}

type thumb struct {
	Thumbnail
	Src template.URL
}

func strategyRows(r *Report) []strategyRow {
	var rows []strategyRow
	rnd := r.Strategies[StrategyRandom.String()].StepCostSum
	for _, s := range Strategies() {
		if sm, ok := r.Strategies[s.String()]; ok {
			vs := 0.0
			if sm.StepCostSum > 0 {
				vs = rnd / sm.StepCostSum
			}
			rows = append(rows, strategyRow{s.String(), sm, vs})
		}
	}
	return rows
}

// stepSections draws every step of Detail: one heatmap per strategy on a
// shared colour scale, and imbalance and compute efficiency over steps.
func stepSections(r *Report) stepsView {
	by := map[string][]StepDetail{}
	var names []string
	for _, d := range r.Detail {
		if _, ok := by[d.Strategy]; !ok {
			names = append(names, d.Strategy)
		}
		by[d.Strategy] = append(by[d.Strategy], d)
	}
	v := stepsView{Total: r.Steps}
	var devs []float64
	for _, ds := range by {
		v.Shown = max(v.Shown, len(ds))
		for _, d := range ds {
			if m := meanOf(d.RankCost); m > 0 {
				for _, c := range d.RankCost {
					devs = append(devs, math.Abs(c/m-1))
				}
			}
		}
	}
	slices.Sort(devs)
	v.Span = math.Min(0.5, math.Max(0.02, quantileOf(devs, 0.99)))
	v.Legend = heatLegendSVG(v.Span)
	var imb, eff []series
	for _, n := range names {
		ds := by[n]
		v.Heatmaps = append(v.Heatmaps, heatmapView{n, heatmapSVG(ds, v.Span)})
		x, yi, ye := make([]float64, len(ds)), make([]float64, len(ds)), make([]float64, len(ds))
		for i, d := range ds {
			x[i], yi[i], ye[i] = float64(d.Step), d.Imbalance, d.ComputeEfficiency
		}
		col, dash := strategyStyle(n)
		xi, yi2 := reduceMax(x, yi, 1000)
		imb = append(imb, series{n, col, dash, xi, yi2})
		xe, ye2 := reduceMax(x, ye, 1000)
		eff = append(eff, series{n, col, dash, xe, ye2})
	}
	v.Imbalance = linesSVG(imb, "step", "max / mean rank cost")
	v.Efficiency = linesSVG(eff, "step", "compute efficiency")
	return v
}

var histTitles = []struct{ key, title string }{
	{"text_tokens", "text tokens per sample"},
	{"image_tokens", "image tokens per sample"},
	{"cost", "cost per sample"},
}

func histograms(r *Report) []histView {
	var out []histView
	for _, ht := range histTitles {
		h, ok := r.Histograms[ht.key]
		if !ok {
			continue
		}
		title := ht.title
		if ht.key == "cost" {
			title += " (" + r.Unit + ")"
		}
		out = append(out, histView{ht.key, title, h, histogramSVG(h, title)})
	}
	return out
}

func quarantineRows(r *Report) []quarantineRow {
	var out []quarantineRow
	for reason, g := range r.QuarantineReasons {
		out = append(out, quarantineRow{reason, g.Count, strings.Join(g.Examples, ", ")})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Reason < out[j].Reason
	})
	return out
}

// safeMIME keeps data URLs to the image types the pipeline writes.
func safeMIME(m string) string {
	switch m {
	case "image/png", "image/jpeg", "image/gif", "image/webp":
		return m
	}
	return "application/octet-stream"
}

var funcs = template.FuncMap{
	"f4":  func(v float64) string { return fmt.Sprintf("%.4f", v) },
	"f3":  func(v float64) string { return fmt.Sprintf("%.3f", v) },
	"g":   func(v float64) string { return fmt.Sprintf("%.6g", v) },
	"pct": func(v float64) float64 { return 100 * v },
}

var pageTmpl = template.Must(template.New("report").Funcs(funcs).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>mmfeed balance report</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.2em auto;max-width:1180px;padding:0 1em;color:#222;line-height:1.35}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.15em;margin:1.4em 0 .4em;border-bottom:2px solid #0072B2}h3{font-size:1em;margin:.8em 0 .2em}
table{border-collapse:collapse;margin:.4em 0}td,th{padding:.25em .7em;border-bottom:1px solid #ddd;text-align:right;font-variant-numeric:tabular-nums}
th:first-child,td:first-child{text-align:left}svg{max-width:100%;height:auto}
.grid{display:flex;flex-wrap:wrap;gap:1em}.note{color:#555;font-size:.9em}.empty{color:#777;font-style:italic}
figure{margin:0}figcaption{font-size:.82em;color:#444;max-width:200px;overflow-wrap:anywhere}
.thumbs figure{border:1px solid #ddd;padding:4px;background:#fafafa}.thumbs img{display:block;max-width:192px;max-height:192px}
progress{width:30em;max-width:100%;height:1.1em}
</style></head><body>
<h1>mmfeed balance report</h1>
<p><span data-key="samples">{{.R.Samples}}</span> samples, <span data-key="quarantined">{{.R.Quarantined}}</span> quarantined,
<span data-key="dropped">{{.R.Dropped}}</span> dropped; <span data-key="steps">{{.R.Steps}}</span> steps on dp <span data-key="dp">{{.R.DP}}</span> ×
<span data-key="micro_batches">{{.R.MicroBatches}}</span> micro-batches; placement {{.R.Placement}}, sync {{.R.Sync}}; lookahead {{.R.Lookahead}}
(delay {{.R.MinDelay}}…{{.R.MaxDelay}} steps); cost unit {{.R.Unit}}; epoch {{.R.Epoch}}.</p>
<p><strong>Speedup vs random: <span data-key="speedup_vs_random">{{f3 .R.SpeedupVsRandom}}</span>×</strong>
<span class="note">(predicted epoch time, Σ over steps of the slowest rank's padded cost)</span></p>
<table id="strategies"><thead><tr><th>strategy</th><th>imbalance p50</th><th>p99</th><th>max</th><th>padding efficiency</th><th>compute efficiency</th><th>Σ step cost</th><th>vs random</th></tr></thead><tbody>
{{range .Rows}}<tr><td>{{.Name}}</td><td data-key="strategies.{{.Name}}.imbalance_p50">{{f4 .S.ImbalanceP50}}</td><td data-key="strategies.{{.Name}}.imbalance_p99">{{f4 .S.ImbalanceP99}}</td><td data-key="strategies.{{.Name}}.imbalance_max">{{f4 .S.ImbalanceMax}}</td><td data-key="strategies.{{.Name}}.padding_efficiency">{{f4 .S.PaddingEfficiency}}</td><td data-key="strategies.{{.Name}}.compute_efficiency">{{f4 .S.ComputeEfficiency}}</td><td data-key="strategies.{{.Name}}.step_cost_sum">{{g .S.StepCostSum}}</td><td>{{f3 .Vs}}×</td></tr>
{{end}}</tbody></table>
<p class="note">imbalance: a step's cost over its mean rank cost (1 is perfect); padding efficiency: real over padded text tokens; compute efficiency: real over padded cost.</p>
{{if .Live}}<h2>Live</h2>
<section id="live"{{if .Poll}} data-poll="{{.Poll}}"{{end}}>{{.LiveHTML}}</section>
{{if .Poll}}<script>
(function(){var s=document.getElementById('live'),u=s.getAttribute('data-poll'),n=0;if(location.protocol==='file:')return;
function tick(){fetch(u,{credentials:'same-origin',cache:'no-store'}).then(function(r){if(r.ok)return r.text();throw r.status}).then(function(t){s.innerHTML=t;s.setAttribute('data-updates',++n);setTimeout(tick,2000)}).catch(function(){setTimeout(tick,5000)})}
setTimeout(tick,2000)})();
</script>{{end}}{{end}}
<h2>Every step</h2>
<p class="note">{{if lt .Steps.Shown .Steps.Total}}The first {{.Steps.Shown}} of {{.Steps.Total}} steps. {{end}}Per-rank cost over the step's mean rank cost, ranks down, steps across; a dot marks the slowest rank. A column holds several steps when there are more than 480 (their largest values).</p>
{{.Steps.Legend}}
<div>{{range .Steps.Heatmaps}}<figure><figcaption>{{.Strategy}}</figcaption>{{.SVG}}</figure>{{end}}</div>
<h3>Imbalance over steps</h3>{{.Steps.Imbalance}}
<h3>Compute efficiency over steps</h3>{{.Steps.Efficiency}}
<h2>Samples (mmfeed plan)</h2>
<div class="grid">{{range .Hists}}<figure>{{.SVG}}<figcaption>mean <span data-key="histograms.{{.Key}}.mean">{{g .H.Mean}}</span>, p50 <span data-key="histograms.{{.Key}}.p50">{{g .H.P50}}</span>, p99 <span data-key="histograms.{{.Key}}.p99">{{g .H.P99}}</span>, max <span data-key="histograms.{{.Key}}.max">{{g .H.Max}}</span></figcaption></figure>{{end}}</div>
{{with .R.TextTruncation}}<p id="truncation">captions truncated at max length <span data-key="text_truncation.max_length">{{.MaxLength}}</span>: <span data-key="text_truncation.at_max_length">{{.AtMaxLength}}</span> of <span data-key="text_truncation.captions">{{.Captions}}</span> ({{printf "%.1f" (pct .Share)}}%){{if gt .Share 0.01}} <b>more than 1%: their text is cut, raise --max-length to keep it</b>{{end}}</p>{{end}}
{{if .Thumbs}}<h3>The samples that drive cost</h3>
<div class="grid thumbs">{{range .Thumbs}}<figure><img src="{{.Src}}" alt="{{.ID}}" width="{{.Width}}" height="{{.Height}}"><figcaption><b>{{.Kind}}</b> {{.ID}}<br>text {{.TextTokens}}, image {{.ImageTokens}} tokens<br>cost {{g .Cost}} {{$.R.Unit}}</figcaption></figure>{{end}}</div>{{end}}
<h2>Quarantine</h2>
{{if .Quarantine}}<table id="quarantine"><thead><tr><th>reason</th><th>samples</th><th>examples</th></tr></thead><tbody>
{{range .Quarantine}}<tr><td>{{.Reason}}</td><td data-key="quarantine_reasons.{{.Reason}}.count">{{.Count}}</td><td style="text-align:left">{{.Examples}}</td></tr>
{{end}}</tbody></table>{{else}}<p class="empty">nothing quarantined</p>{{end}}
<p class="note">plan {{.R.PlanHash}}</p>
</body></html>
`))

// Handler serves the current report: HTML by default, JSON with ?format=json
// or an Accept: application/json header. report is called per request and may
// return nil while no report exists yet (503).
func Handler(report func() *Report) http.Handler {
	return LiveHandler(func() (*Report, *LiveView) { return report(), nil })
}

// LiveHandler serves the report page with its live section: the page at the
// handler's path, the live section alone with ?part=live (what the page polls),
// JSON with ?format=json or Accept: application/json. report is called per
// request; a nil Report means none yet (503).
func LiveHandler(report func() (*Report, *LiveView)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r, live := report()
		if r == nil {
			http.Error(w, "no balance report yet", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		q := req.URL.Query()
		switch {
		case q.Get("format") == "json" || strings.Contains(req.Header.Get("Accept"), "application/json"):
			w.Header().Set("Content-Type", "application/json")
			_ = r.WriteJSON(w)
		case q.Get("part") == "live" && live != nil:
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_ = WriteLiveHTML(w, live)
		default:
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			poll := ""
			if live != nil {
				poll = "?part=live"
			}
			_ = WritePage(w, r, live, poll)
		}
	})
}
