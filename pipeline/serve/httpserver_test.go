package serve

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// TestHTTPLimits: a client that sends half a request, or that keeps an idle
// keep-alive connection, is disconnected by the server within its limits.
func TestHTTPLimits(t *testing.T) {
	l := httpLimits{readHeader: 200 * time.Millisecond, read: time.Second, write: time.Second,
		idle: 300 * time.Millisecond, maxHeaderBytes: 4 << 10}
	srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }), l)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	closedWithin := func(name string, c net.Conn, d time.Duration) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(d))
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%s: connection still open after %v", name, d)
		}
	}
	slow, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	io.WriteString(slow, "GET / HTTP/1.1\r\nHost: x\r\n") // never finishes its headers
	closedWithin("half a request", slow, 5*time.Second)

	idle, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	io.WriteString(idle, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("response %v, %v", resp, err)
	}
	resp.Body.Close()
	closedWithin("idle keep-alive", idle, 5*time.Second)
}

// TestRuntimeMetrics: /metrics carries the service's families and the Go
// runtime's (go_goroutines, process_resident_memory_bytes) once each, also
// when the caller's registry has its own Go collector.
func TestRuntimeMetrics(t *testing.T) {
	for _, tc := range []struct {
		name   string
		withGo bool
	}{{"service registry", false}, {"registry with a Go collector", true}} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			c := prometheus.NewCounter(prometheus.CounterOpts{Name: "mmfeed_test_total", Help: "a counter"})
			reg.MustRegister(c)
			if tc.withGo {
				reg.MustRegister(collectors.NewGoCollector())
			}
			rec := httptest.NewRecorder()
			promhttp.HandlerFor(withRuntimeMetrics(reg), promhttp.HandlerOpts{}).
				ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			body := rec.Body.String()
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d: %s", rec.Code, body)
			}
			for _, want := range []string{"mmfeed_test_total 0", "go_goroutines ", "process_resident_memory_bytes "} {
				if n := strings.Count(body, "\n"+want); n != 1 {
					t.Errorf("%q appears %d times in\n%s", want, n, body)
				}
			}
		})
	}
}

// TestHTTPTLS: with HTTPTLSCert and HTTPTLSKey the service serves HTTPS: a
// client that trusts the CA (mmfeed creds --tls-hosts) gets /healthz and,
// with the token, /metrics; a client without the CA, or speaking plain
// HTTP, gets nothing.
func TestHTTPTLS(t *testing.T) {
	dir := t.TempDir()
	if err := natsenv.WriteTLS(dir, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, corpus(t, 16), 2, 1, "colocated")
	cfg.HTTPTLSCert, cfg.HTTPTLSKey = filepath.Join(dir, natsenv.TLSServerCertFile), filepath.Join(dir, natsenv.TLSServerKeyFile)
	cfg.HTTPToken = "t0ken"
	r := start(t, cfg)
	pem, err := os.ReadFile(filepath.Join(dir, natsenv.TLSCAFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	trusting := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	get := func(c *http.Client, url, token string) (int, string, error) {
		req, _ := http.NewRequest("GET", url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	base := "https://" + r.s.HTTPAddr()
	for _, tc := range []struct {
		name, url, token string
		client           *http.Client
		code             int
		want             string // in the body; or in the error when code is 0
	}{
		{"healthz with the CA", base + "/healthz", "", trusting, 200, "ok"},
		{"metrics with the CA and token", base + "/metrics", "t0ken", trusting, 200, "go_goroutines"},
		{"metrics without the token", base + "/metrics", "", trusting, 401, ""},
		{"without the CA", base + "/healthz", "", &http.Client{Timeout: 10 * time.Second}, 0, "certificate"},
		{"plain http", "http://" + r.s.HTTPAddr() + "/healthz", "", trusting, 400, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, err := get(tc.client, tc.url, tc.token)
			switch {
			case tc.code == 0 && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %d %q, %v; want an error with %q", code, body, err, tc.want)
			case tc.code != 0 && (err != nil || code != tc.code || !strings.Contains(body, tc.want)):
				t.Errorf("got %d, %v; want %d with %q in %q", code, err, tc.code, tc.want, body)
			}
		})
	}
}

// TestHTTPTLSConfig: a certificate needs its key and an HTTP address.
func TestHTTPTLSConfig(t *testing.T) {
	for _, tc := range []struct {
		name, http, cert, key string
		ok                    bool
	}{
		{"both", "127.0.0.1:0", "c.pem", "k.pem", true},
		{"cert only", "127.0.0.1:0", "c.pem", "", false},
		{"key only", "127.0.0.1:0", "", "k.pem", false},
		{"no http", "", "c.pem", "k.pem", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "manifest.jsonl", 2, 1, "colocated")
			cfg.HTTP, cfg.HTTPTLSCert, cfg.HTTPTLSKey = tc.http, tc.cert, tc.key
			if err := cfg.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate: %v, want ok %v", err, tc.ok)
			}
		})
	}
}
