package work

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/mmfeed/mmfeed/loader/synth"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/proto"
)

// Heavy items (more than heavyFactor × the mean predicted cost) of the
// steps past the window are issued early, and only once: the normal pass
// skips them later.
func TestHeavyItemsIssuedEarlyOnce(t *testing.T) {
	ns := testnats.Server(t, testnats.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prep, plan := prepared(t, ctx, 200)
	const job = "job-1"
	base := prep.BatchMeta(job, 0, proto.ModalityAll, plan.Config.Pack)
	src := ItemSource{Features: &prep.Features, Epoch: 0, Image: prep.Config.Image,
		Meta: func(step, r int) (proto.BatchMeta, error) { m := base; m.Step, m.DPRank = step, r; return m, nil }}
	nc, js := testnats.Connect(t, ns.ClientURL())
	if _, err := EnsureQueue(ctx, js, 1, time.Second); err != nil {
		t.Fatal(err)
	}
	w, err := NewPlanner(job, 1, 4, js, nc, "cfg", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	all := func(int) bool { return true }
	const window = 4 // 4 steps × 2 dp × 2 micro-batches: enough items to tell heavy ones
	for _, st := range plan.Steps[:window] {
		if err := w.IssueStep(ctx, src, plan, st, all, false); err != nil {
			t.Fatal(err)
		}
	}
	sum, n := w.costSum, w.costN
	var heavy []Key
	for _, st := range plan.Steps[window:] {
		for dp, mbs := range st.Ranks {
			for mb, entries := range mbs {
				if w.heavy(costOf(&prep.Features, entries)) {
					heavy = append(heavy, Key{Epoch: 0, Step: st.Index, DP: dp, MicroBatch: mb})
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
		if err := w.IssueStep(ctx, src, plan, st, all, true); err != nil {
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
		if err := w.IssueStep(ctx, src, plan, st, all, false); err != nil {
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

// prepared is a skewed synthetic corpus of n samples (some bad) prepared
// for 2 dp ranks of 2 micro-batches with small images, and its plan.
func prepared(t *testing.T, ctx context.Context, n int) (*pipeline.Prepared, *balancer.Plan) {
	t.Helper()
	sc := synth.DefaultConfig()
	sc.Out, sc.Samples, sc.Seed, sc.Format, sc.BadFraction = t.TempDir(), n, 7, "jsonl", 0.05
	sum, err := synth.Generate(ctx, sc)
	if err != nil {
		t.Fatal(err)
	}
	pc := pipeline.DefaultConfig()
	pc.Input = sum.Path
	pc.Plan.DP, pc.Plan.MicroBatches, pc.Plan.GlobalBatch = 2, 2, 8
	if pc.Plan.Placement, err = balancer.ParsePlacement("colocated"); err != nil {
		t.Fatal(err)
	}
	pc.Image.Size, pc.Image.PatchSize = 32, 16
	pc.Workers = 2
	prep, err := pipeline.Prepare(ctx, pc, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prep.Close() })
	plan, err := prep.Plan(pc.Plan.Strategy)
	if err != nil {
		t.Fatal(err)
	}
	return prep, plan
}
