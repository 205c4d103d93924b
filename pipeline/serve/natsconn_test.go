package serve

import (
	"context"
	"errors"
	"net"
	"runtime"
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

// startNATS honours its context: one that has ended leaves no server or
// connection behind (the listen port stays free) and says why.
func TestStartNATSHonoursContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := testConfig(t, "unused", 1, 1, "colocated")
	cfg.NATS.Listen = addr
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.startNATS(ctx); !errors.Is(err, context.Canceled) {
		s.stopNATS()
		t.Fatalf("startNATS with an ended context: %v, want context.Canceled", err)
	}
	again, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the NATS port is held after a cancelled start: %v", err)
	}
	again.Close()
}

// partsRunning counts the goroutines running one of the service's parts.
func partsRunning() int {
	buf := make([]byte, 1<<22)
	stacks := string(buf[:runtime.Stack(buf, true)])
	n := 0
	for _, part := range []string{"(*Service).logProgress(", "(*Lease).Hold(", "(*Service).watchAssets(", "(*positionLog).run("} {
		n += strings.Count(stacks, part)
	}
	return n
}

// A start that fails after the parts began (the HTTP address is taken)
// stops them before Run returns: no part outlives Run.
func TestRunStopsItsPartsOnAFailedStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := testConfig(t, corpus(t, 8), 1, 1, "colocated")
	cfg.HTTP = ln.Addr().String()
	before := partsRunning()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel() // stays alive while the parts are counted
	if err := s.Run(ctx); err == nil || !strings.Contains(err.Error(), "http listen") {
		t.Fatalf("Run with a taken HTTP address: %v, want the listen error", err)
	}
	if n := partsRunning(); n > before {
		t.Errorf("%d goroutines of the service's parts run after Run returned (before it: %d)", n, before)
	}
}
