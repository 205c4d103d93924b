package serve

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
)

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
