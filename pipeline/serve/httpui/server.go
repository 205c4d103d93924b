package httpui

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

// httpLimits bounds what one HTTP client can hold: a client that trickles its
// request headers or body, never reads its response, or keeps an idle
// keep-alive connection open loses the connection (and the goroutine behind
// it) after these times.
type httpLimits struct {
	readHeader, read, write, idle time.Duration
	maxHeaderBytes                int
}

// defaultHTTPLimits fit the report endpoints: small JSON, metrics and
// an HTML page, no streaming responses.
var defaultHTTPLimits = httpLimits{readHeader: 10 * time.Second, read: 30 * time.Second,
	write: 60 * time.Second, idle: 120 * time.Second, maxHeaderBytes: 64 << 10}

// newHTTPServer returns the report server of h with limits l.
func newHTTPServer(h http.Handler, l httpLimits) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.readHeader, ReadTimeout: l.read,
		WriteTimeout: l.write, IdleTimeout: l.idle, MaxHeaderBytes: l.maxHeaderBytes}
}

// Config is what the report server is told: its listen address, its
// certificate and key (both, or neither: plain HTTP) and the token that
// guards every path but /healthz and /login ("": none).
type Config struct {
	Addr, TLSCert, TLSKey, Token string
}

// Server is the report's HTTP server: the routes of Handler, answered
// from src, with /metrics gathered from reg and the Go runtime.
type Server struct {
	cfg Config
	src Source
	reg prometheus.Gatherer
	srv *http.Server
}

// New returns the report server of cfg, answering from src.
func New(cfg Config, src Source, reg prometheus.Gatherer) *Server {
	s := &Server{cfg: cfg, src: src, reg: reg}
	s.srv = newHTTPServer(s.Handler(), defaultHTTPLimits)
	return s
}

// Listen listens on the configured address: plain TCP, or TLS (1.2 at
// least) with the configured certificate and key, which are read once, here.
func (s *Server) Listen() (net.Listener, error) {
	var tc *tls.Config
	if s.cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(s.cfg.TLSCert, s.cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("http tls: %w", err)
		}
		tc = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil || tc == nil {
		return ln, err
	}
	return tls.NewListener(ln, tc), nil
}

// Serve serves the routes on ln until Shutdown (then it returns nil).
func (s *Server) Serve(ln net.Listener) error {
	if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops the server: it closes the listener, then waits for the
// requests in flight until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// runtimeRegistry holds the Go runtime and process collectors
// (go_goroutines, go_memstats_*, process_resident_memory_bytes, ...), one per
// process: the soak test reads go_goroutines from /metrics before and after
// its load to find goroutines that outlive their requests.
var runtimeRegistry = sync.OnceValue(func() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
})

// withRuntimeMetrics returns a Gatherer of reg's families and the runtime
// ones reg does not have already (a caller's registry may carry its own Go
// collector).
func withRuntimeMetrics(reg prometheus.Gatherer) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		own, err := reg.Gather()
		if err != nil {
			return own, err
		}
		rt, err := runtimeRegistry().Gather()
		have := make(map[string]bool, len(own))
		for _, f := range own {
			have[f.GetName()] = true
		}
		for _, f := range rt {
			if !have[f.GetName()] {
				own = append(own, f)
			}
		}
		sort.Slice(own, func(i, j int) bool { return own[i].GetName() < own[j].GetName() })
		return own, err
	})
}
