package report

import (
	"bytes"
	"fmt"
	"html/template"
	"io"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline"
)

// writeRunHTML writes a run report page: the balance report page of the
// epoch's comparison with its live section as it was (no polling), and the
// measured section before the page's end; a mixture's per-source section
// (pipeline.InsertMixtureHTML) as the live page has it. Every number of the measured
// section carries data-key, its path in the JSON file (docs/report.md).
func writeRunHTML(w io.Writer, rr RunReport, lv *balancer.LiveView) error {
	var sec bytes.Buffer
	if err := runTmpl.Execute(&sec, rr.Run); err != nil {
		return err
	}
	if rr.Report == nil { // stopped before the first comparison was built
		var live bytes.Buffer
		if err := balancer.WriteLiveHTML(&live, lv); err != nil {
			return err
		}
		_, err := fmt.Fprintf(w, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>mmfeed run report</title></head><body>\n"+
			"<h1>mmfeed run report</h1>\n<p>no strategy comparison yet: the service stopped before the first epoch's was built.</p>\n"+
			"<h2>Live</h2>\n<section id=\"live\">%s</section>\n%s</body></html>\n", live.Bytes(), sec.Bytes())
		return err
	}
	var page bytes.Buffer
	if err := balancer.WritePage(&page, rr.Report, lv, ""); err != nil {
		return err
	}
	b, err := pipeline.InsertMixtureHTML(page.Bytes(), rr.Mixture)
	if err != nil {
		return err
	}
	end := bytes.LastIndex(b, []byte("</body>"))
	if end < 0 {
		return fmt.Errorf("serve: run report: the report page has no </body>")
	}
	for _, part := range [][]byte{b[:end], sec.Bytes(), b[end:]} {
		if _, err := w.Write(part); err != nil {
			return err
		}
	}
	return nil
}

var runTmpl = template.Must(template.New("run").Funcs(template.FuncMap{
	"f4": func(v float64) string { return fmt.Sprintf("%.4f", v) },
}).Parse(`<h2 id="run">Measured: what the trainers did</h2>
<p>job <b>{{.Job}}</b>, written {{.WrittenAt.Format "2006-01-02 15:04:05 UTC"}} ({{.Reason}}, epoch {{.Epoch}}):
<span data-key="run.steps_trained">{{.StepsTrained}}</span> of <span data-key="run.steps_total">{{.StepsTotal}}</span> steps trained,
<span data-key="run.steps_published">{{.StepsPublished}}</span> published{{if .FinishedTraining}}; <b>training finished</b>{{else if .FinishedPublishing}}; publishing finished, training not{{end}}.</p>
{{range $i, $e := .Epochs}}<h3>Epoch {{$e.Epoch}}</h3>
<p><span data-key="run.epochs.{{$i}}.steps_trained">{{$e.StepsTrained}}</span> of <span data-key="run.epochs.{{$i}}.steps">{{$e.Steps}}</span> steps trained,
<span data-key="run.epochs.{{$i}}.steps_published">{{$e.StepsPublished}}</span> published, <span data-key="run.epochs.{{$i}}.steps_measured">{{$e.StepsMeasured}}</span> measured by every rank
({{$e.StepsIncomplete}} incomplete).</p>
<table class="run-imbalance"><thead><tr><th>imbalance (max/mean over dp ranks)</th><th>steps</th><th>mean</th><th>max</th></tr></thead><tbody>
<tr><td>measured step time</td><td>{{$e.MeasuredImbalance.Steps}}</td><td data-key="run.epochs.{{$i}}.measured_imbalance.mean">{{f4 $e.MeasuredImbalance.Mean}}</td><td data-key="run.epochs.{{$i}}.measured_imbalance.max">{{f4 $e.MeasuredImbalance.Max}}</td></tr>
<tr><td>predicted cost, same steps</td><td>{{$e.PredictedImbalance.Steps}}</td><td data-key="run.epochs.{{$i}}.predicted_imbalance.mean">{{f4 $e.PredictedImbalance.Mean}}</td><td data-key="run.epochs.{{$i}}.predicted_imbalance.max">{{f4 $e.PredictedImbalance.Max}}</td></tr>
<tr><td>predicted cost, every published step</td><td>{{$e.PlannedImbalance.Steps}}</td><td data-key="run.epochs.{{$i}}.planned_imbalance.mean">{{f4 $e.PlannedImbalance.Mean}}</td><td data-key="run.epochs.{{$i}}.planned_imbalance.max">{{f4 $e.PlannedImbalance.Max}}</td></tr>
</tbody></table>
<table class="run-ranks"><thead><tr><th>dp rank</th><th>steps</th><th>mean s</th><th>max s</th><th>total s</th><th>mean data wait s</th></tr></thead><tbody>
{{range $r, $m := $e.Ranks}}<tr><td>{{$m.DP}}</td><td data-key="run.epochs.{{$i}}.ranks.{{$r}}.steps">{{$m.Steps}}</td><td data-key="run.epochs.{{$i}}.ranks.{{$r}}.mean_seconds">{{f4 $m.MeanSeconds}}</td><td data-key="run.epochs.{{$i}}.ranks.{{$r}}.max_seconds">{{f4 $m.MaxSeconds}}</td><td data-key="run.epochs.{{$i}}.ranks.{{$r}}.total_seconds">{{f4 $m.TotalSeconds}}</td><td data-key="run.epochs.{{$i}}.ranks.{{$r}}.mean_data_wait_seconds">{{f4 $m.MeanDataWaitSeconds}}</td></tr>
{{end}}</tbody></table>
{{if $e.Quarantined}}<p>quarantined in epoch {{$e.Epoch}}: {{range $k, $n := $e.Quarantined}}{{$k}} <span data-key="run.epochs.{{$i}}.quarantined.{{$k}}">{{$n}}</span>; {{end}}</p>{{end}}
{{else}}<p class="empty">no step published by this service.</p>{{end}}
`))
