// Package testnats is the one home of the test helpers that tests of several
// packages share: an embedded NATS server with JetStream (port -1 or a fixed
// port, no signal handlers, waited on until it accepts connections, shut
// down at the end of the test), a connection with its JetStream context,
// checkFor-style polling instead of bare sleeps, JSON message publishing,
// and a test logger (MMFEED_TEST_LOG).
//
// Inputs: a testing.TB and options. Outputs: running servers and
// connections whose cleanup is registered on the TB. Ownership and
// concurrency: everything returned belongs to the calling test; CheckFor
// runs f on the calling goroutine.
//
// Only tests import this package (internal/arch keeps it out of the
// binary); it imports nothing of this module, so proto's own tests can use
// it.
package testnats

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Options configures Server. The zero value is a JetStream server on a free
// port with a temporary store.
type Options struct {
	// Port is the client port; 0 means -1 (a free port).
	Port int
	// StoreDir is the JetStream store; "" means a fresh tb.TempDir().
	StoreDir string
	// MaxPayload is the server's max_payload; 0 keeps the 1 MB default.
	MaxPayload int32
}

// Server runs an embedded JetStream server on 127.0.0.1 and shuts it down
// when the test ends.
func Server(tb testing.TB, o Options) *server.Server {
	tb.Helper()
	if o.Port == 0 {
		o.Port = -1
	}
	if o.StoreDir == "" {
		o.StoreDir = tb.TempDir()
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: o.Port, JetStream: true,
		StoreDir: o.StoreDir, NoSigs: true, NoLog: true, MaxPayload: o.MaxPayload})
	if err != nil {
		tb.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		tb.Fatal("nats server not ready after 10s")
	}
	tb.Cleanup(s.Shutdown)
	return s
}

// Connect connects to url and returns the connection and its JetStream
// context; the connection is closed when the test ends.
func Connect(tb testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return nc, js
}

// CheckFor polls f every `every` until it returns nil, failing the test with
// f's last error when total passes.
func CheckFor(tb testing.TB, total, every time.Duration, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(total)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(every)
	}
	tb.Fatalf("condition not met after %v: %v", total, err)
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Logger is a test's logger: it discards every line, or with
// MMFEED_TEST_LOG set writes them at debug level to stderr, tagged with the
// test's name.
func Logger(tb testing.TB) *slog.Logger {
	if os.Getenv("MMFEED_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", tb.Name())
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// PublishJSON publishes v encoded as JSON on subject and flushes, so the
// server has it when PublishJSON returns.
func PublishJSON(tb testing.TB, nc *nats.Conn, subject string, v any) {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	if err := nc.Publish(subject, b); err != nil {
		tb.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		tb.Fatal(err)
	}
}
