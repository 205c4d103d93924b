package balancer

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func testReport(t *testing.T) *Report {
	t.Helper()
	items := genItems(128*20+9, genDynamic, 8)
	items[4].TextTokens = -1
	r, err := Compare(items, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestReportJSON(t *testing.T) {
	r := testReport(t)
	var buf bytes.Buffer
	if err := r.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"samples", "quarantined", "steps", "dp", "speedup_vs_random", "max_delay", "strategies"} {
		if _, ok := m[k]; !ok {
			t.Errorf("report lacks %q", k)
		}
	}
	strategies := m["strategies"].(map[string]any)
	for _, s := range []string{"mmfeed", "random", "length_grouped"} {
		st, ok := strategies[s].(map[string]any)
		if !ok {
			t.Fatalf("report lacks strategy %q", s)
		}
		for _, k := range []string{"imbalance_p50", "imbalance_p99", "imbalance_max", "padding_efficiency", "step_cost_sum"} {
			if _, ok := st[k]; !ok {
				t.Errorf("strategy %s lacks %q", s, k)
			}
		}
	}
	if got, want := r.Samples, 128*20; got != want { // 2569 items − 1 rejected − 8 dropped
		t.Errorf("samples %d, want %d", got, want)
	}
	if got, want := r.Quarantined, 1; got != want {
		t.Errorf("quarantined %d, want %d", got, want)
	}
	if got, want := r.Dropped, 8; got != want {
		t.Errorf("dropped %d, want %d", got, want)
	}
	want := r.Strategies["random"].StepCostSum / r.Strategies["mmfeed"].StepCostSum
	if got := r.SpeedupVsRandom; got != want || got <= 1 {
		t.Errorf("speedup %v, want %v (> 1)", got, want)
	}
	var again bytes.Buffer
	if err := testReport(t).WriteJSON(&again); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Error("report JSON is not deterministic")
	}
}

func TestReportTableAndHTML(t *testing.T) {
	r := testReport(t)
	var tbl bytes.Buffer
	if err := r.WriteTable(&tbl); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"mmfeed", "random", "length_grouped", "speedup vs random"} {
		if !strings.Contains(tbl.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tbl.String())
		}
	}
	var page bytes.Buffer
	if err := WriteHTML(&page, r); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	perStrategy := r.Steps // every step, fewer than maxHeatCols
	if got, want := strings.Count(html, `<circle`), 3*perStrategy; got != want {
		t.Errorf("%d slowest-rank marks, want %d (one per step and strategy)", got, want)
	}
	if got, want := strings.Count(html, `<rect x="56.00"`), 3*r.DP; got != want {
		t.Errorf("%d first-column heatmap cells, want %d", got, want)
	}
	for _, bad := range []string{"<script", "src=", "href=", "https://", "http://example"} {
		if strings.Contains(html, bad) {
			t.Errorf("page is not self-contained: contains %q", bad)
		}
	}
}

func TestHandler(t *testing.T) {
	r := testReport(t)
	var cur *Report
	h := Handler(func() *Report { return cur })
	tests := []struct {
		target, accept string
		code           int
		ctype          string
		set            bool
	}{
		{"/", "", http.StatusServiceUnavailable, "text/plain", false},
		{"/", "", http.StatusOK, "text/html", true},
		{"/?format=json", "", http.StatusOK, "application/json", true},
		{"/", "application/json", http.StatusOK, "application/json", true},
	}
	for _, tt := range tests {
		if tt.set {
			cur = r
		}
		req := httptest.NewRequest(http.MethodGet, tt.target, nil)
		if tt.accept != "" {
			req.Header.Set("Accept", tt.accept)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tt.code || !strings.HasPrefix(rec.Header().Get("Content-Type"), tt.ctype) {
			t.Errorf("%s accept %q: got %d %q, want %d %q", tt.target, tt.accept, rec.Code, rec.Header().Get("Content-Type"), tt.code, tt.ctype)
		}
	}
}
