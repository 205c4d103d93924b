package natsenv

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// TestEmbeddedListenNeedsAuth: a non-loopback NATS listener without
// authentication is refused unless Insecure; with users it is allowed.
func TestEmbeddedListenNeedsAuth(t *testing.T) {
	conf, _ := writeAuth(t, "job-1", 1, 1)
	tests := []struct {
		name     string
		listen   string
		conf     string
		insecure bool
		want     error
	}{
		{"loopback", "127.0.0.1:0", "", false, nil},
		{"localhost", "localhost:0", "", false, nil},
		{"in-process", "", "", false, nil},
		{"every address", "0.0.0.0:0", "", false, ErrInsecure},
		{"every address, insecure", "0.0.0.0:0", "", true, nil},
		{"every address, users", "0.0.0.0:0", conf, false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nc := Config{Listen: tc.listen, ServerConfig: tc.conf, DataDir: t.TempDir(), MaxPayload: 1 << 20}
			_, err := embeddedOptions(nc, &Security{Insecure: tc.insecure})
			if !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestRedact(t *testing.T) {
	got := Redact("nats://user:pw@host:4222,tls://h2:4222")
	if want := "nats://***@host:4222,tls://h2:4222"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// freePort returns a loopback address no one listens on (just closed).
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// StartEmbedded honours its context: one that has ended starts nothing (the
// listen port stays free), and the wait for a server that never becomes
// ready ends with ctx, not after its 30 s.
func TestStartEmbeddedHonoursContext(t *testing.T) {
	t.Run("ended before", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		addr := freePort(t)
		cfg := Config{Listen: addr, DataDir: t.TempDir(), MaxPayload: 1 << 20}
		s, err := StartEmbedded(ctx, cfg, &Security{})
		if !errors.Is(err, context.Canceled) || s != nil {
			t.Fatalf("got %v, %v; want no server and context.Canceled", s, err)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("the listen port is held after a cancelled start: %v", err)
		}
		ln.Close()
	})
	t.Run("ends during the wait", func(t *testing.T) {
		opts, err := embeddedOptions(Config{DataDir: t.TempDir(), MaxPayload: 1 << 20}, &Security{})
		if err != nil {
			t.Fatal(err)
		}
		s, err := server.NewServer(opts) // never started: never ready
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		t0 := time.Now()
		err = awaitReady(ctx, s, 30*time.Second)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want context.DeadlineExceeded", err)
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Errorf("returned after %v, want about ctx's 200ms", d)
		}
	})
}
