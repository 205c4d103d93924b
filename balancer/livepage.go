package balancer

import (
	"bytes"
	"fmt"
	"html/template"
	"io"
	"math"
	"sort"
	"time"
)

// LiveView is what the report page shows of a running service: progress,
// predicted against measured step time per rank, data wait, throughput and the
// calibration fit over time. The service fills it from its live report; the
// JSON paths of its numbers (data-key in the page) are those of /v1/report.
type LiveView struct {
	Job string
	// Finished says every step is published (the trainers may still be
	// training: Done says both).
	Finished bool
	// StepsPublished counts the steps published to every rank (all epochs);
	// StepsTrained those every rank acknowledged; StepsTotal is the job's
	// step count when known (0: unknown).
	StepsPublished, StepsTrained, StepsTotal int
	Samples                                  int64
	ElapsedSeconds                           float64
	SamplesPerSecond                         float64
	// Unit is the predicted cost's unit before the first calibration.
	Unit string
	// Steps are the newest published steps, oldest first.
	Steps []LiveStepView
	// Fit is the calibration's quality each time it was refit, oldest first.
	Fit []FitPoint
	// Quarantined counts quarantined samples by reason.
	Quarantined map[string]int64
}

// LiveStepView is one published step: per dp rank, predicted seconds under
// the latest calibration (nil before one), predicted cost in the plan's unit,
// and the trainer's measured compute and data-wait seconds (0 until reported).
type LiveStepView struct {
	Epoch, Step      int
	PredictedSeconds []float64
	PredictedCost    []float64
	MeasuredSeconds  []float64
	DataWaitSeconds  []float64
}

// FitPoint is the calibration fit at a number of observations.
type FitPoint struct {
	Observations int
	R2, RelErr   float64
	// PriorRelErr is the best-scaled prior's error on the same observations.
	PriorRelErr float64
}

// Done reports whether every step is published and trained.
func (l *LiveView) Done() bool {
	return l.Finished && l.StepsTotal > 0 && l.StepsTrained >= l.StepsTotal
}

// ETASeconds estimates the time left to the trainers' end from the training
// rate so far (the publishing rate before any step is trained); -1 when
// unknown.
func (l *LiveView) ETASeconds() float64 {
	if l.Done() {
		return 0
	}
	done := l.StepsTrained
	if done <= 0 && !l.Finished {
		done = l.StepsPublished
	}
	if l.StepsTotal <= 0 || done <= 0 || l.ElapsedSeconds <= 0 {
		return -1
	}
	return l.ElapsedSeconds / float64(done) * float64(max(l.StepsTotal-done, 0))
}

// measured reports whether every rank reported the step.
func (s LiveStepView) measured() bool {
	if len(s.MeasuredSeconds) == 0 {
		return false
	}
	for _, v := range s.MeasuredSeconds {
		if !(v > 0) {
			return false
		}
	}
	return true
}

// WriteLiveHTML writes the live section's inner HTML (what the page polls).
func WriteLiveHTML(w io.Writer, l *LiveView) error {
	_, err := io.WriteString(w, string(renderLive(l)))
	return err
}

type liveData struct {
	L                 *LiveView
	Percent           float64 // trained
	PublishedPercent  float64
	ETA               string
	Last              *LiveStepView
	LastRanks         []liveRank
	Measured          int
	Times, Wait, Fits template.HTML
	Pairs             template.HTML
	Fit               *FitPoint
	Quarantine        []quarantineRow
}

type liveRank struct {
	Rank                          int
	Predicted, Measured, DataWait float64
	HasPredicted                  bool
}

func renderLive(l *LiveView) template.HTML {
	d := liveData{L: l, ETA: "unknown"}
	if l.StepsTotal > 0 {
		d.Percent = 100 * float64(l.StepsTrained) / float64(l.StepsTotal)
		d.PublishedPercent = 100 * float64(l.StepsPublished) / float64(l.StepsTotal)
	}
	if eta := l.ETASeconds(); eta >= 0 {
		d.ETA = (time.Duration(eta) * time.Second).String()
	}
	var stepX, pred, meas []float64
	var waitSum []float64
	for i := range l.Steps {
		s := &l.Steps[i]
		if !s.measured() {
			continue
		}
		d.Measured++
		d.Last = s
		stepX = append(stepX, float64(s.Step))
		meas = append(meas, maxOf(s.MeasuredSeconds))
		if s.PredictedSeconds != nil {
			pred = append(pred, maxOf(s.PredictedSeconds))
		} else {
			pred = append(pred, nan())
		}
		if waitSum == nil {
			waitSum = make([]float64, len(s.DataWaitSeconds))
		}
		for r, v := range s.DataWaitSeconds {
			if r < len(waitSum) {
				waitSum[r] += v
			}
		}
	}
	if d.Last != nil {
		var groups []barGroup
		for r := range d.Last.MeasuredSeconds {
			lr := liveRank{Rank: r, Measured: d.Last.MeasuredSeconds[r]}
			if r < len(d.Last.DataWaitSeconds) {
				lr.DataWait = d.Last.DataWaitSeconds[r]
			}
			if r < len(d.Last.PredictedSeconds) {
				lr.Predicted, lr.HasPredicted = d.Last.PredictedSeconds[r], true
			}
			d.LastRanks = append(d.LastRanks, lr)
			p := nan()
			if lr.HasPredicted {
				p = lr.Predicted
			}
			groups = append(groups, barGroup{fmt.Sprintf("%d", r), []float64{p, lr.Measured}})
		}
		d.Pairs = groupedBarsSVG(groups, []string{"predicted", "measured"}, []string{colBlue, colOrange}, "seconds")
		d.Times = linesSVG([]series{{"predicted", colBlue, "", stepX, pred}, {"measured", colOrange, "6 3", stepX, meas}}, "step", "slowest rank, s")
		var wg []barGroup
		for r, v := range waitSum {
			wg = append(wg, barGroup{fmt.Sprintf("%d", r), []float64{1e3 * v / float64(d.Measured)}})
		}
		d.Wait = groupedBarsSVG(wg, []string{"data wait"}, []string{colPurple}, "ms per step")
	}
	if len(l.Fit) > 0 {
		x, r2, rel, prior := make([]float64, len(l.Fit)), make([]float64, len(l.Fit)), make([]float64, len(l.Fit)), make([]float64, len(l.Fit))
		for i, f := range l.Fit {
			x[i], r2[i], rel[i], prior[i] = float64(f.Observations), f.R2, f.RelErr, f.PriorRelErr
		}
		d.Fits = linesSVG([]series{{"R²", colGreen, "", x, r2}, {"relative error", colVermilion, "6 3", x, rel}, {"prior's error", colGrey, "2 2", x, prior}}, "observations", "")
		d.Fit = &l.Fit[len(l.Fit)-1]
	}
	for reason, n := range l.Quarantined {
		d.Quarantine = append(d.Quarantine, quarantineRow{Reason: reason, Count: n})
	}
	sort.Slice(d.Quarantine, func(i, j int) bool { return d.Quarantine[i].Reason < d.Quarantine[j].Reason })
	var buf bytes.Buffer
	if err := liveTmpl.Execute(&buf, d); err != nil {
		return template.HTML(template.HTMLEscapeString(err.Error()))
	}
	return template.HTML(buf.String())
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func nan() float64 { return math.NaN() }

var liveTmpl = template.Must(template.New("live").Funcs(funcs).Parse(`<div data-finished="{{.L.Finished}}">
<p>job <b>{{.L.Job}}</b>: <span data-key="live.steps_trained">{{.L.StepsTrained}}</span>{{if .L.StepsTotal}} of {{.L.StepsTotal}}{{end}} steps trained (acknowledged by every rank)
{{if .L.StepsTotal}}<progress id="trained" value="{{.L.StepsTrained}}" max="{{.L.StepsTotal}}"></progress> {{printf "%.1f" .Percent}}%{{end}}<br>
<span data-key="live.steps_published">{{.L.StepsPublished}}</span>{{if .L.StepsTotal}} of {{.L.StepsTotal}}{{end}} steps published
{{if .L.StepsTotal}}<progress id="published" value="{{.L.StepsPublished}}" max="{{.L.StepsTotal}}"></progress> {{printf "%.1f" .PublishedPercent}}%{{end}}
{{if .L.Done}}<b>finished</b>{{else}}{{if .L.Finished}}<b>publishing finished</b>, trainers still training; {{end}}ETA <span id="eta">{{.ETA}}</span>{{end}}<br>
<span data-key="live.throughput.samples">{{.L.Samples}}</span> samples in {{printf "%.1f" .L.ElapsedSeconds}} s:
{{printf "%.1f" .L.SamplesPerSecond}} samples/s</p>
{{if .Last}}<h3>Predicted and measured step time per rank, step {{.Last.Step}} (the newest every rank reported)</h3>
{{.Pairs}}
<table id="live-ranks"><thead><tr><th>dp rank</th><th>predicted s</th><th>measured s</th><th>data wait s</th></tr></thead><tbody>
{{range .LastRanks}}<tr><td>{{.Rank}}</td><td{{if .HasPredicted}} data-key="live.step.{{$.Last.Epoch}}.{{$.Last.Step}}.predicted_seconds.{{.Rank}}"{{end}}>{{if .HasPredicted}}{{f4 .Predicted}}{{else}}not calibrated yet{{end}}</td><td data-key="live.step.{{$.Last.Epoch}}.{{$.Last.Step}}.measured_seconds.{{.Rank}}">{{f4 .Measured}}</td><td data-key="live.step.{{$.Last.Epoch}}.{{$.Last.Step}}.data_wait_seconds.{{.Rank}}">{{f4 .DataWait}}</td></tr>
{{end}}</tbody></table>
<h3>Step time over the last {{.Measured}} measured steps</h3>{{.Times}}
<h3>Data wait per dp rank (mean over those steps)</h3>{{.Wait}}
{{else}}<p class="empty">no trainer feedback yet: step times appear once every rank reports a step.</p>{{end}}
<h3>Calibration fit over time</h3>
{{if .Fit}}<p>fitted to <span data-key="live.calibration.fit.n">{{.Fit.Observations}}</span> observations: R² <span data-key="live.calibration.fit.r2">{{f4 .Fit.R2}}</span>, mean relative error <span data-key="live.calibration.fit.mean_rel_err">{{f4 .Fit.RelErr}}</span> (the analytic prior, best scaled: <span data-key="live.calibration.prior.mean_rel_err">{{f4 .Fit.PriorRelErr}}</span>)</p>
{{.Fits}}{{else}}<p class="empty">not enough feedback to fit the cost model yet.</p>{{end}}
{{if .Quarantine}}<p>quarantined so far: {{range .Quarantine}}{{.Reason}} <span data-key="live.quarantined.{{.Reason}}">{{.Count}}</span>; {{end}}</p>{{end}}
</div>`))
