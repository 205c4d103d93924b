package proto

import (
	"context"
	"encoding/json"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// outage is a server that a test can take away and bring back on the same
// port, with connections that reconnect to it at once.
type outage struct {
	t    *testing.T
	s    *server.Server
	port int
}

func newOutage(t *testing.T) *outage {
	s := testnats.Server(t, testnats.Options{})
	return &outage{t: t, s: s, port: s.Addr().(*net.TCPAddr).Port}
}

func (o *outage) connect() *nats.Conn {
	nc, err := nats.Connect(o.s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		o.t.Fatal(err)
	}
	o.t.Cleanup(nc.Close)
	return nc
}

// restart shuts the server down and starts it again on the same port: every
// request and reply in flight is lost, and the connections reconnect.
func (o *outage) restart() {
	o.s.Shutdown()
	o.s.WaitForShutdown()
	time.Sleep(100 * time.Millisecond)
	o.s = testnats.Server(o.t, testnats.Options{Port: o.port})
}

// TestRegisterRankAsksAgain loses the first register the ways a NATS outage
// does and checks that RegisterRank sends it again instead of waiting for an
// answer that cannot come: the service got the register but its reply left
// with the trainer's old connection (the server restarted), no service
// subscribes yet (no responders), and a register is never answered.
func TestRegisterRankAsksAgain(t *testing.T) {
	reg := Register{Job: "job-1", DPRank: 1, MPRank: 0, DP: 2, MP: 1, Placement: PlacementColocated}
	subj, _ := RankControlSubject(reg.Job, CtlRegister, reg.DPRank, reg.MPRank)
	tests := []struct {
		name    string
		attempt time.Duration
		lose    string // what happens to the first register: outage, no service or unanswered
	}{
		{"reply lost in an outage", time.Minute, "outage"},
		{"no service yet", time.Minute, "no service"},
		{"unanswered", 200 * time.Millisecond, "unanswered"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := newOutage(t)
			svc, trainer := o.connect(), o.connect()
			var n atomic.Int32
			lost := make(chan struct{}, 1)
			answer := func(m *nats.Msg) {
				if n.Add(1) == 1 && tc.lose != "no service" {
					lost <- struct{}{} // and no answer
					return
				}
				b, _ := json.Marshal(RegisterReply{OK: true, Steps: 3, MicroBatches: 2, DP: 2, MP: 1, Placement: PlacementColocated})
				_ = m.Respond(b)
			}
			subscribe := func() {
				if _, err := svc.Subscribe(subj, answer); err != nil {
					t.Fatal(err)
				}
				if err := svc.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			if tc.lose != "no service" {
				subscribe()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // far below the attempt
			defer cancel()
			t0 := time.Now()
			var rep RegisterReply
			done := make(chan error, 1)
			go func() {
				var err error
				rep, err = RegisterRank(ctx, trainer, reg, tc.attempt)
				done <- err
			}()
			switch tc.lose {
			case "outage":
				select {
				case <-lost:
					o.restart()
				case <-ctx.Done():
				}
			case "no service":
				time.Sleep(300 * time.Millisecond)
				subscribe()
			}
			if err := <-done; err != nil {
				t.Fatalf("after %v: %v", time.Since(t0).Round(time.Millisecond), err)
			}
			if !rep.OK || rep.Steps != 3 {
				t.Errorf("got %+v, want the service's ok reply", rep)
			}
			if tc.lose != "no service" && n.Load() != 2 {
				t.Errorf("the service got %d registers, want 2 (the lost one and one more)", n.Load())
			}
			t.Logf("answered after %v", time.Since(t0).Round(time.Millisecond))
		})
	}
}

// TestFetcherAckAsksAgainAfterOutage: an ack whose answer is lost in an
// outage is sent again when the rank's connection reconnects, so Batch.Ack
// does not wait out its context.
func TestFetcherAckAsksAgainAfterOutage(t *testing.T) {
	o := newOutage(t)
	svc, rank := o.connect(), o.connect()
	cfg := DefaultFetcherConfig("job-1", 0, 0)
	cfg.Timeout = time.Minute
	f, err := NewFetcher(rank, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n atomic.Int32
	lost := make(chan struct{}, 1)
	if _, err := svc.Subscribe(f.ackSub, func(m *nats.Msg) {
		if n.Add(1) == 1 {
			lost <- struct{}{}
			return
		}
		_ = m.Respond(nil)
	}); err != nil {
		t.Fatal(err)
	}
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.ack(ctx, BatchKey{Job: "job-1", Epoch: 0, Step: 3, MicroBatch: 1}) }()
	select {
	case <-lost:
		o.restart()
	case <-ctx.Done():
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n.Load() != 2 {
		t.Errorf("the service got %d acks, want 2", n.Load())
	}
}
