package pipeline

import (
	"bytes"
	"fmt"
	"html/template"
	"io"

	"github.com/mmfeed/mmfeed/balancer"
)

// WriteHTML writes the report as an HTML section: a heading and one table
// row per source. Every number carries data-key, its path in a JSON object
// that holds the report as "mixture" (`report --json`, serve's /v1/report,
// a --report-out file), as the balance report page's numbers do
// (docs/report.md); shares are fractions, as in the JSON.
func (r *MixtureReport) WriteHTML(w io.Writer) error {
	return mixtureTmpl.Execute(w, r)
}

// InsertMixtureHTML returns page (a balance report page, balancer.WritePage)
// with r's section (WriteHTML) before its "Every step" heading, or before
// </body> when it has none; page itself when r is nil.
func InsertMixtureHTML(page []byte, r *MixtureReport) ([]byte, error) {
	if r == nil {
		return page, nil
	}
	at := bytes.Index(page, []byte(everyStepHeading))
	if at < 0 {
		at = bytes.LastIndex(page, []byte("</body>"))
	}
	if at < 0 {
		return nil, fmt.Errorf("pipeline: mixture section: the report page has no %q or </body>", everyStepHeading)
	}
	var sec bytes.Buffer
	if err := r.WriteHTML(&sec); err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(page)+sec.Len())
	out = append(out, page[:at]...)
	out = append(out, sec.Bytes()...)
	return append(out, page[at:]...), nil
}

// everyStepHeading is the balance report page's heading the mixture section
// goes before (after the strategy table and the live section).
const everyStepHeading = "<h2>Every step</h2>"

var mixtureTmpl = template.Must(template.New("mixture").Funcs(template.FuncMap{
	"f4": func(v float64) string { return fmt.Sprintf("%.4f", v) },
	"f1": func(v float64) string { return fmt.Sprintf("%.1f", v) },
	"g4": func(v float64) string { return fmt.Sprintf("%.4g", v) },
}).Parse(`<h2 id="mixture">Mixture: per source</h2>
<p><span data-key="mixture.planned">{{.Planned}}</span> planned draws over <span data-key="mixture.steps">{{.Steps}}</span> steps; share is a source's part of the planned draws, want its weight's part of the weights.</p>
<table class="mixture"><thead><tr><th>source</th><th>weight</th><th>want</th><th>share</th><th>samples</th><th>draws</th><th>planned</th><th>repeats</th><th>samples/step</th><th>min</th><th>max</th><th>text tokens/step</th><th>image tokens/step</th><th>cost/step</th></tr></thead><tbody>
{{range $i, $s := .Sources}}<tr><td>{{$s.Name}}</td><td data-key="mixture.sources.{{$i}}.weight">{{g4 $s.Weight}}</td><td data-key="mixture.sources.{{$i}}.want_share">{{f4 $s.WantShare}}</td><td data-key="mixture.sources.{{$i}}.share">{{f4 $s.Share}}</td><td data-key="mixture.sources.{{$i}}.samples">{{$s.Samples}}</td><td data-key="mixture.sources.{{$i}}.draws">{{$s.Draws}}</td><td data-key="mixture.sources.{{$i}}.planned">{{$s.Planned}}</td><td data-key="mixture.sources.{{$i}}.repeats">{{$s.Repeats}}</td><td data-key="mixture.sources.{{$i}}.samples_per_step">{{f1 $s.SamplesPerStep}}</td><td data-key="mixture.sources.{{$i}}.min_samples_per_step">{{$s.MinSamplesPerStep}}</td><td data-key="mixture.sources.{{$i}}.max_samples_per_step">{{$s.MaxSamplesPerStep}}</td><td data-key="mixture.sources.{{$i}}.text_tokens_per_step">{{f1 $s.TextTokensPerStep}}</td><td data-key="mixture.sources.{{$i}}.image_tokens_per_step">{{f1 $s.ImageTokensPerStep}}</td><td data-key="mixture.sources.{{$i}}.cost_per_step">{{g4 $s.CostPerStep}}</td></tr>
{{end}}</tbody></table>
`))

// WriteReportHTML writes the static report page of rep (balancer.WriteHTML)
// with a mixture's per-source section (mix; nil for a plain input): what
// `report --html` and shard's report.html write.
func WriteReportHTML(w io.Writer, rep *balancer.Report, mix *MixtureReport) error {
	var page bytes.Buffer
	if err := balancer.WriteHTML(&page, rep); err != nil {
		return err
	}
	b, err := InsertMixtureHTML(page.Bytes(), mix)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}
