package balancer

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

func TestWriteStepTimesHTML(t *testing.T) {
	groups := []StepTimeGroup{{
		Title: "skewed <corpus>",
		Runs: []StepTimes{
			{Strategy: "mmfeed", Seconds: []float64{0.1, 0.1, 0.2, math.NaN()}, IdleFraction: 0.1, ImbalancePredicted: 1.01, ImbalanceMeasured: 1.05},
			{Strategy: "random", Seconds: []float64{0.2, 0.2, 0.3, 0.5}, IdleFraction: 0.3, ImbalancePredicted: 1.2, ImbalanceMeasured: 1.3},
			{Strategy: "empty"},
		},
	}}
	var page bytes.Buffer
	if err := WriteStepTimesHTML(&page, "e2e", groups); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	tests := []struct {
		name string
		want string
	}{
		{"escaped title", "skewed &lt;corpus&gt;"},
		{"mmfeed mean skips NaN", "<td>mmfeed</td><td>3</td><td>133.3</td>"},
		{"random p99", "<td>random</td><td>4</td><td>300.0</td><td>200.0</td><td>500.0</td>"},
		{"ratio to the first run", "<td>2.250×</td>"},
		{"idle", "<td>30.0%</td>"},
		{"empty run", "<td>empty</td><td>0</td>"},
		{"axis", "500 ms</text>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(html, tt.want) {
				t.Errorf("page lacks %q:\n%s", tt.want, html)
			}
		})
	}
	if got, want := strings.Count(html, "<rect"), 3*20; got != want {
		t.Errorf("%d histogram bins, want %d", got, want)
	}
	for _, bad := range []string{"<script", "src=", "href="} {
		if strings.Contains(html, bad) {
			t.Errorf("page is not self-contained: contains %q", bad)
		}
	}
}

func TestQuantileOf(t *testing.T) {
	tests := []struct {
		v    []float64
		q    float64
		want float64
	}{
		{nil, 0.5, 0},
		{[]float64{1}, 0.99, 1},
		{[]float64{1, 2, 3, 4}, 0.5, 2},
		{[]float64{1, 2, 3, 4}, 0.99, 4},
		{[]float64{1, 2, 3, 4}, 0, 1},
	}
	for _, tt := range tests {
		if got := quantileOf(tt.v, tt.q); got != tt.want {
			t.Errorf("quantileOf(%v, %g) = %g, want %g", tt.v, tt.q, got, tt.want)
		}
	}
}
