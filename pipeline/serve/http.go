package serve

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler returns the read-only HTTP API: /v1/report (JSON), /metrics
// (Prometheus), /healthz and / (the HTML balance report). With HTTPToken set,
// every path but /healthz needs "Authorization: Bearer <token>".
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.Handle("GET /metrics", s.auth(promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})))
	mux.Handle("GET /v1/report", s.auth(http.HandlerFunc(s.reportJSON)))
	mux.Handle("GET /v1/cost-model", s.auth(http.HandlerFunc(s.costModelJSON)))
	mux.Handle("GET /{$}", s.auth(balancer.Handler(func() *balancer.Report {
		if r := s.snapshot(); r != nil {
			return r.Report
		}
		return nil
	})))
	return mux
}

func (s *Service) auth(h http.Handler) http.Handler {
	if s.cfg.HTTPToken == "" {
		return h
	}
	want := []byte("Bearer " + s.cfg.HTTPToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mmfeed"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (s *Service) healthz(w http.ResponseWriter, _ *http.Request) {
	if s.nc == nil || !s.nc.IsConnected() {
		http.Error(w, "nats not connected", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

func (s *Service) reportJSON(w http.ResponseWriter, _ *http.Request) {
	r := s.snapshot()
	if r == nil {
		http.Error(w, "no epoch planned yet", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(r)
}
