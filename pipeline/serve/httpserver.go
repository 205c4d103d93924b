package serve

import (
	"net/http"
	"time"
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
