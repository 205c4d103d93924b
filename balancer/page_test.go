package balancer

import (
	"bytes"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mmfeed/mmfeed/internal/reportcheck"
)

// pageReport is testReport with what the pipeline adds: quarantine reasons
// and a thumbnail.
func pageReport(t *testing.T) *Report {
	r := testReport(t)
	r.QuarantineReasons = map[string]QuarantineGroup{
		"empty_image":   {Count: 3, Examples: []string{"a<1>", "b", "c"}},
		"plan_rejected": {Count: 1, Examples: []string{"x"}},
	}
	r.Thumbnails = []Thumbnail{{Kind: "heaviest", ID: "big", Width: 4, Height: 2, TextTokens: 9, ImageTokens: 196, Cost: 1.5, MIME: "image/png", Image: []byte{1, 2, 3}}}
	return r
}

func testLive() *LiveView {
	lv := &LiveView{Job: "j", StepsPublished: 3, StepsTotal: 12, Samples: 300, ElapsedSeconds: 6, SamplesPerSecond: 50}
	for s := range 3 {
		st := LiveStepView{Epoch: 0, Step: s, PredictedCost: []float64{1, 2}, MeasuredSeconds: []float64{0.1, 0.2}, DataWaitSeconds: []float64{0.01, 0.02}}
		if s == 2 {
			st.MeasuredSeconds = []float64{0.3, 0} // rank 1 has not reported
		}
		if s == 1 {
			st.PredictedSeconds = []float64{0.15, 0.25}
		}
		lv.Steps = append(lv.Steps, st)
	}
	lv.Fit = []FitPoint{{Observations: 4, R2: 0.5, RelErr: 0.2, PriorRelErr: 0.3}, {Observations: 8, R2: 0.75, RelErr: 0.1, PriorRelErr: 0.3}}
	lv.Quarantined = map[string]int64{"empty_image": 3}
	return lv
}

// TestPageNumbersMatchJSON reads every data-key number of the static page back
// and checks it against the report JSON.
func TestPageNumbersMatchJSON(t *testing.T) {
	r := pageReport(t)
	var page, js bytes.Buffer
	if err := WriteHTML(&page, r); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	n, err := reportcheck.Compare(page.String(), js.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	// 7 header numbers, 3 strategies × 6 columns, 3 histograms × 4, 2 reasons.
	if want := 7 + 3*6 + 3*4 + 2; n != want {
		t.Errorf("checked %d values, want %d", n, want)
	}
	r.Strategies["mmfeed"] = Summary{ImbalanceP99: 9}
	js.Reset()
	_ = r.WriteJSON(&js)
	if _, err := reportcheck.Compare(page.String(), js.Bytes()); err == nil || !strings.Contains(err.Error(), "strategies.mmfeed.imbalance_p99") {
		t.Errorf("a changed report still matches the page: %v", err)
	}
}

func TestPageContent(t *testing.T) {
	r := pageReport(t)
	var static, live bytes.Buffer
	if err := WriteHTML(&static, r); err != nil {
		t.Fatal(err)
	}
	if err := WritePage(&live, r, testLive(), "?part=live"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, page, want string
		present          bool
	}{
		{"thumbnail is a data URL", static.String(), `src="data:image/png;base64,AQID"`, true},
		{"thumbnail caption", static.String(), "text 9, image 196 tokens", true},
		{"example ids escaped", static.String(), "a&lt;1&gt;, b, c", true},
		{"reasons by count", static.String(), "<td>empty_image</td><td data-key=\"quarantine_reasons.empty_image.count\">3</td>", true},
		{"static has no script", static.String(), "<script", false},
		{"static has no live section", static.String(), `id="live"`, false},
		{"live polls", live.String(), `data-poll="?part=live"`, true},
		{"live script", live.String(), "<script>", true},
		{"newest fully measured step", live.String(), "step 1 (the newest every rank reported)", true},
		{"measured rank 1", live.String(), `data-key="live.step.0.1.measured_seconds.1">0.2000<`, true},
		{"predicted rank 0", live.String(), `data-key="live.step.0.1.predicted_seconds.0">0.1500<`, true},
		{"ETA from the rate", live.String(), `<span id="eta">18s</span>`, true},
		{"fit", live.String(), `data-key="live.calibration.fit.r2">0.7500<`, true},
		{"no external resources", live.String(), "https://", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := strings.Contains(tt.page, tt.want); got != tt.present {
				t.Errorf("page contains %q: %v, want %v", tt.want, got, tt.present)
			}
		})
	}
}

func TestLiveFragmentBeforeFeedback(t *testing.T) {
	var b bytes.Buffer
	if err := WriteLiveHTML(&b, &LiveView{Job: "j"}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"no trainer feedback yet", "not enough feedback", "ETA <span id=\"eta\">unknown</span>", `data-finished="false"`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("fragment lacks %q:\n%s", want, b.String())
		}
	}
}

func TestHeatmapBucketsSteps(t *testing.T) {
	ds := make([]StepDetail, 1000)
	for i := range ds {
		ds[i] = StepDetail{Step: i, RankCost: []float64{1, 1, 1, 1}}
	}
	ds[777].RankCost = []float64{1, 1, 3, 1}
	svg := string(heatmapSVG(ds, 0.1))
	if got, want := strings.Count(svg, "<circle"), maxHeatCols; got != want {
		t.Errorf("%d columns, want %d", got, want)
	}
	if !strings.Contains(svg, `fill="#d55e00"`) {
		t.Error("the straggler of step 777 is not shown at full colour")
	}
}

func TestNewHistogram(t *testing.T) {
	tests := []struct {
		name   string
		v      []float64
		bins   int
		counts []int
		lo, hi float64
	}{
		{"empty", nil, 3, []int{0, 0, 0}, 0, 0},
		{"one value", []float64{5}, 2, []int{1, 0}, 5, 5},
		{"max in last bin", []float64{0, 1, 2, 3}, 3, []int{1, 1, 2}, 0, 3},
		{"non-finite skipped", []float64{1, math.NaN(), math.Inf(1), 2}, 2, []int{1, 1}, 1, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHistogram(tt.v, tt.bins)
			if !equalInts(h.Counts, tt.counts) || h.Lo != tt.lo || h.Hi != tt.hi {
				t.Errorf("got %v [%g, %g], want %v [%g, %g]", h.Counts, h.Lo, h.Hi, tt.counts, tt.lo, tt.hi)
			}
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestHeaviest(t *testing.T) {
	items := genItems(256, genDynamic, 3)
	p, err := Build(items, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	h := p.Heaviest(5)
	if len(h) != 5 {
		t.Fatalf("%d items, want 5", len(h))
	}
	for i := 1; i < len(h); i++ {
		if p.ItemCost(h[i]) > p.ItemCost(h[i-1]) {
			t.Errorf("not heaviest first: %v", h)
		}
	}
	top := 0.0
	for _, s := range p.Steps {
		for _, rk := range s.Ranks {
			for _, mb := range rk {
				for _, e := range mb {
					if e.Weight > 0 {
						top = max(top, p.ItemCost(e.Item))
					}
				}
			}
		}
	}
	if p.ItemCost(h[0]) != top {
		t.Errorf("heaviest costs %g, the plan's most costly sample %g", p.ItemCost(h[0]), top)
	}
}

func TestLiveHandlerPart(t *testing.T) {
	r, lv := pageReport(t), testLive()
	h := LiveHandler(func() (*Report, *LiveView) { return r, lv })
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/?part=live", nil))
	if rec.Code != http.StatusOK || strings.Contains(rec.Body.String(), "<html") || !strings.Contains(rec.Body.String(), "steps published") {
		t.Errorf("?part=live: %d, body %.200s", rec.Code, rec.Body.String())
	}
}
