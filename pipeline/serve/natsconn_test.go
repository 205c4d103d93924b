package serve

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// A --nats-listen port another process holds is named as such at once;
// before, the service waited 30 s and said "embedded nats server not ready".
func TestNATSListenPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := testConfig(t, corpus(t, 8), 1, 1, "colocated")
	cfg.NATS.Listen = ln.Addr().String()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Now()
	err = s.Run(ctx)
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "already in use") || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("serve on a taken port: %v, want the port named as in use", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("took %v to say so", d)
	}
}
