package serve

import (
	"context"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Heavy items (more than heavyFactor × the mean predicted cost) of the
// steps past the window are issued early, and only once: the normal pass
// skips them later.
func TestHeavyItemsIssuedEarlyOnce(t *testing.T) {
	ns := externalServer(t, -1, t.TempDir())
	defer ns.Shutdown()
	cfg := testConfig(t, corpus(t, 200), 2, 1, "colocated")
	cfg.Role = RolePlanner
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ep, err := epochs.PrepareWhole(ctx, cfg.epochConfig(), 0, nil, cfg.Pipeline.Plan.Model)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := work.EnsureQueue(ctx, js, 1, time.Second); err != nil {
		t.Fatal(err)
	}
	w, err := newWorkPlanner(cfg.Job, 1, 4, js, nc, "cfg", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	plan := ep.PlanFrom(0)
	all := func(int) bool { return true }
	const window = 4 // 4 steps × 2 dp × 2 micro-batches: enough items to tell heavy ones
	for _, st := range plan.Steps[:window] {
		if err := w.issueStep(ctx, s, ep, plan, st, all, false); err != nil {
			t.Fatal(err)
		}
	}
	sum, n := w.costSum, w.costN
	var heavy []work.Key
	for _, st := range plan.Steps[window:] {
		for dp, mbs := range st.Ranks {
			for mb, entries := range mbs {
				if w.heavy(costOf(&ep.Prepared().Features, entries)) {
					heavy = append(heavy, work.Key{Epoch: 0, Step: st.Index, DP: dp, MicroBatch: mb})
				}
			}
		}
	}
	if len(heavy) == 0 {
		t.Fatalf("no item past the window costs more than %d × the mean: the test would check nothing", heavyFactor)
	}
	before := w.issued.Load()
	for _, st := range plan.Steps[window:] { // the early pass, with the mean as it was
		w.costSum, w.costN = sum, n
		if err := w.issueStep(ctx, s, ep, plan, st, all, true); err != nil {
			t.Fatal(err)
		}
	}
	w.mu.Lock()
	for _, k := range heavy {
		if w.slots[k] == nil {
			t.Errorf("heavy item %+v was not issued early", k)
		}
	}
	w.mu.Unlock()
	if got := w.early.Load(); got != int64(len(heavy)) || w.issued.Load()-before != got {
		t.Errorf("%d items issued early (%d in all), want the %d heavy ones", got, w.issued.Load()-before, len(heavy))
	}
	for _, st := range plan.Steps[window:] {
		if err := w.issueStep(ctx, s, ep, plan, st, all, false); err != nil {
			t.Fatal(err)
		}
	}
	items := 0
	for _, st := range plan.Steps {
		for _, mbs := range st.Ranks {
			items += len(mbs)
		}
	}
	if got := w.issued.Load(); got != int64(items) {
		t.Errorf("%d items issued, want each of the %d once", got, items)
	}
}
