package work

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/nats-io/nats.go"
)

// A planner that dies holding a worker's result request never answers it:
// the worker asks again and the standby that took over answers, instead of
// the worker's slot waiting out one long timeout (which delayed takeovers
// in test_cluster_roles.py by ~7 s). Without any planner the worker gives
// the item up at once.
func TestWorkerAsksAgainWhenThePlannerDiesHoldingTheRequest(t *testing.T) {
	ns := testnats.Server(t, testnats.Options{})
	defer ns.Shutdown()
	conn := func() *nats.Conn {
		nc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	leader, standby := conn(), conn()
	subj := ResultSubject("job-1")
	if _, err := leader.Subscribe(subj, func(*nats.Msg) { go leader.Close() }); err != nil { // dies holding it
		t.Fatal(err)
	}
	var seen, answered atomic.Int32
	if _, err := standby.Subscribe(subj, func(m *nats.Msg) {
		if seen.Add(1) > 1 { // the first request was the leader's
			answered.Add(1)
			_ = m.Respond([]byte("ok"))
		}
	}); err != nil {
		t.Fatal(err)
	}
	for _, nc := range []*nats.Conn{leader, standby} {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	w := &Worker{nc: conn(), log: testnats.Logger(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := nats.NewMsg(subj)
	done.Header.Set(HdrDone, "item")
	reply, err := w.askPlanner(ctx, done)
	if err != nil || string(reply.Data) != "ok" || answered.Load() != 1 {
		t.Fatalf("reply %v, %v; the standby answered %d times", reply, err, answered.Load())
	}
	standby.Close()
	if _, err := w.askPlanner(ctx, done); err == nil {
		t.Fatal("an answer without a planner")
	}
}
