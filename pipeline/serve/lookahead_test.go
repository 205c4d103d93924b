package serve

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/proto"
)

// holdPlanning makes the background planner of job wait before every
// window after the first until release is closed, and counts its waits.
func holdPlanning(t *testing.T, job string) (release chan struct{}, waits *atomic.Int32) {
	t.Helper()
	release, waits = make(chan struct{}), &atomic.Int32{}
	hook := func(j string, planned int) {
		if j != job {
			return
		}
		waits.Add(1)
		select {
		case <-release:
		case <-time.After(time.Minute): // a broken test ends, never hangs
		}
	}
	SetPlanWindowHook(hook)
	t.Cleanup(func() { SetPlanWindowHook(nil) })
	return release, waits
}

// TestFirstBatchBeforeThePlanIsComplete: the service publishes the first
// window's steps while the rest of the epoch is still being planned (the
// background planner is held after the first window until a rank has
// received its first step), and still delivers every sample exactly once,
// the same rows as the whole plan (mmfeed shard).
func TestFirstBatchBeforeThePlanIsComplete(t *testing.T) {
	for _, tc := range []struct {
		name, plane, role string
	}{
		{"core", proto.DataPlaneCore, RoleAll},
		{"jetstream", proto.DataPlaneJetStream, RoleAll},
		{"planner with workers", proto.DataPlaneCore, RolePlanner},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, corpus(t, 160), 2, 1, "colocated")
			cfg.Job, cfg.DataPlane, cfg.Role, cfg.Recalibrate = "incremental", tc.plane, tc.role, -1
			cfg.QuarantineDir = t.TempDir()
			if tc.role == RolePlanner {
				cfg.LocalWorkers = 1
			}
			cfg.Pipeline.Plan.Lookahead = 4 // about 20 steps of 8 samples: 5 windows
			release, waits := holdPlanning(t, cfg.Job)
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			r := startService(t, s)
			var once sync.Once
			var planned, total int
			setup := func(tr *trainer) {
				tr.barrier = func(ctx context.Context, k proto.BatchKey) error { // a whole step received
					once.Do(func() {
						planned, total, _, _ = s.epochs.Plan(0).Planning()
						close(release)
					})
					return nil
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			trs := runTrainersWith(t, ctx, cfg, r.s.ClientURL(), []int{0}, false, setup)
			if err := r.wait(t, 30*time.Second); err != nil {
				t.Fatalf("service: %v", err)
			}
			ex := shardExpectation(t, cfg, 0)
			if total != ex.steps || planned == 0 || planned >= total || waits.Load() == 0 {
				t.Fatalf("first step received with %d of %d steps planned (planner held %d times), want fewer than all of %d",
					planned, total, waits.Load(), ex.steps)
			}
			t.Logf("first step received with %d of %d steps planned", planned, total)
			checkDelivery(t, cfg, trs, 0, ex)
			realOnce(t, trs, 0, ex, len(quarantinedIDs(t, cfg.QuarantineDir, 0)))
			checkQuarantineOnce(t, cfg.QuarantineDir, 0)
		})
	}
}

// TestRestartChecksThePlanHash: a restart that replans the epoch from the
// same inputs gets the hash recorded after the first window and serves the
// same steps; any change to the plan's inputs is refused.
func TestRestartChecksThePlanHash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	input := corpus(t, 96)
	cfg := testConfig(t, input, 2, 1, "colocated")
	base, err := PrepareWhole(ctx, cfg.epochConfig(), 0, nil, cfg.Pipeline.Plan.Model)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	lookahead, seed := cfg, cfg
	lookahead.Pipeline.Plan.Lookahead++
	seed.Pipeline.Plan.Seed++
	for _, tc := range []struct {
		name   string
		cfg    Config
		stored func(EpochInfo) EpochInfo
		ok     bool
	}{
		{"same inputs", cfg, func(in EpochInfo) EpochInfo { return in }, true},
		{"lookahead changed", lookahead, func(in EpochInfo) EpochInfo { return in }, false},
		{"seed changed", seed, func(in EpochInfo) EpochInfo { return in }, false},
		{"recorded by another planner version", cfg, func(in EpochInfo) EpochInfo { in.PlanHash = "x" + in.PlanHash[1:]; return in }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stored := tc.stored(base.info)
			ep, err := PrepareWhole(ctx, tc.cfg.epochConfig(), 0, &stored, tc.cfg.Pipeline.Plan.Model)
			if !tc.ok {
				if !errors.Is(err, ErrJobMismatch) {
					t.Fatalf("got %v, want ErrJobMismatch", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer ep.Close()
			if ep.info.PlanHash != base.info.PlanHash || len(ep.steps) != len(base.steps) {
				t.Fatalf("replanned %.12s (%d steps), recorded %.12s (%d)", ep.info.PlanHash, len(ep.steps), base.info.PlanHash, len(base.steps))
			}
			if !reflect.DeepEqual(ep.steps, base.steps) {
				t.Fatal("the steps differ after the restart")
			}
		})
	}
}

// TestReplanWaitsForTheWholePlan: while the background planner is held
// after the first window, a step past it is not readable (planFrom is
// empty there, features unknown) and a recalibration keeps the plan; once
// the epoch is planned to the end both work.
func TestReplanWaitsForTheWholePlan(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := testConfig(t, corpus(t, 96), 2, 1, "colocated")
	cfg.Job = "replan-waits"
	release, _ := holdPlanning(t, cfg.Job)
	ds, err := pipeline.OpenDataset(ctx, cfg.Pipeline, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	ep, err := Prepare(ctx, cfg.epochConfig(), ds, 0, nil, cfg.Pipeline.Plan.Model, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	first := ep.prog.steps()
	if first == 0 || first >= len(ep.steps) || ep.Planned() {
		t.Fatalf("%d of %d steps planned before the planner was released, want the first window", first, len(ep.steps))
	}
	if got := len(ep.planFrom(first).Steps); got != 0 {
		t.Errorf("planFrom(%d) has %d steps before they are planned", first, got)
	}
	book := newEpochBook(nil, nil)
	book.plans[0] = ep
	if _, ok := book.Features(0, first, 0); ok {
		t.Errorf("features of unplanned step %d", first)
	}
	seg := Segment{FromStep: 1, Model: cfg.Pipeline.Plan.Model}
	seg.Model.Unit = "s"
	if ep.replan(seg) {
		t.Fatal("replanned before the epoch was planned to the end")
	}
	close(release)
	if err := ep.prog.waitAll(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := book.Features(0, first, 0); !ok {
		t.Errorf("no features of step %d once planned", first)
	}
	if !ep.replan(seg) || len(ep.info.Segments) != 2 {
		t.Fatalf("replan after the whole plan: segments %d, want 2", len(ep.info.Segments))
	}
	delete(book.plans, 0) // closed by the deferred ep.close
}
