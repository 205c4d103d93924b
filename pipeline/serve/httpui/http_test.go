package httpui

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/prometheus/client_golang/prometheus"
)

// fakeSource answers with fixed values.
type fakeSource struct {
	health, report error
	view           *View
}

func (f *fakeSource) Healthy() error { return f.health }
func (f *fakeSource) Report() (any, error) {
	if f.report != nil {
		return nil, f.report
	}
	return map[string]int{"steps": 3}, nil
}
func (f *fakeSource) CostModel() any { return map[string]bool{"fitted": true} }
func (f *fakeSource) View() *View    { return f.view }

// marker is a Section that puts its mark before the page's end.
type marker struct{}

func (marker) InsertHTML(page []byte) ([]byte, error) {
	at := strings.LastIndex(string(page), "</body>")
	if at < 0 {
		return nil, errors.New("no </body>")
	}
	return []byte(string(page[:at]) + "<p>MARK</p>" + string(page[at:])), nil
}

// TestRoutesAnswerFromSource: every route's status, type and body come
// from the Source's verbs: its errors are the 503 bodies, its values the
// JSON, and a View's Section is inserted into the full page only.
func TestRoutesAnswerFromSource(t *testing.T) {
	view := &View{Report: &balancer.Report{}, Live: &balancer.LiveView{Job: "j"}}
	mixed := &View{Report: view.Report, Live: view.Live, Section: marker{}}
	for _, tc := range []struct {
		name, path, accept string
		src                *fakeSource
		code               int
		ctype, body        string
		absent             string
	}{
		{"healthy", "/healthz", "", &fakeSource{}, 200, "text/plain; charset=utf-8", "ok\n", ""},
		{"unhealthy", "/healthz", "", &fakeSource{health: errors.New("nats not connected")}, 503, "text/plain; charset=utf-8", "nats not connected\n", ""},
		{"report", "/v1/report", "", &fakeSource{}, 200, "application/json", "{\n  \"steps\": 3\n}\n", ""},
		{"report not yet", "/v1/report", "", &fakeSource{report: errors.New("no epoch planned yet")}, 503, "text/plain; charset=utf-8", "no epoch planned yet\n", ""},
		{"cost model", "/v1/cost-model", "", &fakeSource{}, 200, "application/json", "{\n  \"fitted\": true\n}\n", ""},
		{"page before the first comparison", "/", "text/html", &fakeSource{}, 503, "text/plain; charset=utf-8", "no balance report yet", ""},
		{"plain page", "/", "text/html", &fakeSource{view: view}, 200, "text/html; charset=utf-8", "</html>", "MARK"},
		{"mixture page", "/", "text/html", &fakeSource{view: mixed}, 200, "text/html; charset=utf-8", "<p>MARK</p></body>", ""},
		{"mixture page's live part", "/?part=live", "", &fakeSource{view: mixed}, 200, "text/html; charset=utf-8", "", "MARK"},
		{"mixture page's JSON", "/?format=json", "", &fakeSource{view: mixed}, 200, "application/json", "", "MARK"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := New(Config{}, tc.src, prometheus.NewRegistry()).Handler()
			req := httptest.NewRequest("GET", tc.path, nil)
			if tc.accept != "" {
				req.Header.Set("Accept", tc.accept)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			body := w.Body.String()
			if w.Code != tc.code || w.Header().Get("Content-Type") != tc.ctype || !strings.Contains(body, tc.body) ||
				(tc.absent != "" && strings.Contains(body, tc.absent)) {
				t.Errorf("got %d %q %.200q, want %d %q containing %q without %q", w.Code, w.Header().Get("Content-Type"), body,
					tc.code, tc.ctype, tc.body, tc.absent)
			}
			if strings.HasPrefix(tc.path, "/?") || tc.path == "/" {
				if cc := w.Header().Get("Cache-Control"); w.Code == 200 && cc != "no-store" {
					t.Errorf("Cache-Control %q, want no-store", cc)
				}
			}
			if strings.HasPrefix(tc.path, "/v1/") && w.Code == 200 && body != tc.body {
				t.Errorf("body %q, want exactly %q", body, tc.body)
			}
		})
	}
}
