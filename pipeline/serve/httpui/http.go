package httpui

import (
	"encoding/json"
	"net/http"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Source answers what the routes show; the service implements it. Its
// verbs return values the handler owns (copies or fresh objects), so the
// routes never hold the service's locks.
type Source interface {
	// Healthy returns nil when the service is healthy, else why not (the
	// /healthz body).
	Healthy() error
	// Report returns the /v1/report object (encoded as JSON as it is), or
	// an error saying why there is none yet (the epoch is being planned).
	Report() (any, error)
	// CostModel returns the /v1/cost-model object: the cost model in effect.
	CostModel() any
	// View returns what `/` shows; nil before the first strategy comparison.
	View() *View
}

// View is one moment of the report page: the strategy comparison, the
// live section and, for a mixture, its per-source section.
type View struct {
	Report *balancer.Report
	Live   *balancer.LiveView
	// Section is nil for a plain input.
	Section Section
}

// Section is a part of the full page the balance report page does not
// have (a mixture's per-source lines).
type Section interface {
	// InsertHTML returns page with the section in its place.
	InsertHTML(page []byte) ([]byte, error)
}

// Handler returns the read-only HTTP API: /v1/report (JSON), /metrics
// (Prometheus), /healthz and / (the HTML balance report with its live
// section, which polls /?part=live). With a token, every path but
// /healthz and /login needs "Authorization: Bearer <token>" or the session
// cookie that /login sets (a browser cannot send a bearer header): a form at
// /login, or a token in any page's URL (?token=…), is exchanged for it.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	page := &reportPage{src: s.src}
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /login", s.login)
	mux.HandleFunc("POST /login", s.login)
	mux.Handle("GET /metrics", s.auth(promhttp.HandlerFor(withRuntimeMetrics(s.reg), promhttp.HandlerOpts{})))
	mux.Handle("GET /v1/report", s.auth(http.HandlerFunc(s.reportJSON)))
	mux.Handle("GET /v1/cost-model", s.auth(http.HandlerFunc(s.costModelJSON)))
	mux.Handle("GET /{$}", s.auth(page.handler()))
	return mux
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	if err := s.src.Healthy(); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

func (s *Server) reportJSON(w http.ResponseWriter, _ *http.Request) {
	r, err := s.src.Report()
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	writeJSON(w, r)
}

// costModelJSON serves GET /v1/cost-model: a file `report`/`shard --cost-model` read.
func (s *Server) costModelJSON(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, s.src.CostModel())
}

// writeJSON writes v as indented JSON.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
