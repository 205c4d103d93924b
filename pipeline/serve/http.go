package serve

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler returns the read-only HTTP API: /v1/report (JSON), /metrics
// (Prometheus), /healthz and / (the HTML balance report with its live
// section, which polls /?part=live). With HTTPToken set, every path but
// /healthz and /login needs "Authorization: Bearer <token>" or the session
// cookie that /login sets (a browser cannot send a bearer header): a form at
// /login, or a token in any page's URL (?token=…), is exchanged for it.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	page := &reportPage{s: s}
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /login", s.login)
	mux.HandleFunc("POST /login", s.login)
	mux.Handle("GET /metrics", s.auth(promhttp.HandlerFor(withRuntimeMetrics(s.reg), promhttp.HandlerOpts{})))
	mux.Handle("GET /v1/report", s.auth(http.HandlerFunc(s.reportJSON)))
	mux.Handle("GET /v1/cost-model", s.auth(http.HandlerFunc(s.costModelJSON)))
	mux.Handle("GET /{$}", s.auth(page.handler()))
	return mux
}

func (s *Service) healthz(w http.ResponseWriter, _ *http.Request) {
	if s.nc == nil || !s.nc.IsConnected() {
		http.Error(w, "nats not connected", http.StatusServiceUnavailable)
		return
	}
	if why := s.health.problems(time.Now(), s.cfg.StuckAfter, s.streamHasRoom()); why != "" {
		http.Error(w, why, http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

func (s *Service) reportJSON(w http.ResponseWriter, _ *http.Request) {
	r := s.snapshot()
	if r == nil {
		http.Error(w, s.live.planningStatus(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(r)
}
