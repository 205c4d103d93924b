package httpui

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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
