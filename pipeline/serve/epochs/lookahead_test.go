package epochs

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
)

// holdPlanning makes the background planner of job wait before every window
// after the first until release is closed (serve's holdPlanning, without
// the count).
func holdPlanning(t *testing.T, job string) (release chan struct{}) {
	t.Helper()
	release = make(chan struct{})
	SetPlanWindowHook(func(j string, planned int) {
		if j != job {
			return
		}
		select {
		case <-release:
		case <-time.After(time.Minute): // a broken test ends, never hangs
		}
	})
	t.Cleanup(func() { SetPlanWindowHook(nil) })
	return release
}

// TestRestartChecksThePlanHash: a restart that replans the epoch from the
// same inputs gets the hash recorded after the first window and serves the
// same steps; any change to the plan's inputs is refused.
func TestRestartChecksThePlanHash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	input := corpus(t, 96)
	cfg := testConfig(t, input, 2)
	base, err := PrepareWhole(ctx, cfg, 0, nil, cfg.Pipeline.Plan.Model)
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
		stored func(Info) Info
		ok     bool
	}{
		{"same inputs", cfg, func(in Info) Info { return in }, true},
		{"lookahead changed", lookahead, func(in Info) Info { return in }, false},
		{"seed changed", seed, func(in Info) Info { return in }, false},
		{"recorded by another planner version", cfg, func(in Info) Info { in.PlanHash = "x" + in.PlanHash[1:]; return in }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stored := tc.stored(base.info)
			ep, err := PrepareWhole(ctx, tc.cfg, 0, &stored, tc.cfg.Pipeline.Plan.Model)
			if !tc.ok {
				if !errors.Is(err, work.ErrJobMismatch) {
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
	cfg := testConfig(t, corpus(t, 96), 2)
	cfg.Job = "replan-waits"
	release := holdPlanning(t, cfg.Job)
	ds, err := pipeline.OpenDataset(ctx, cfg.Pipeline, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	ep, err := Prepare(ctx, cfg, ds, 0, nil, cfg.Pipeline.Plan.Model, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	first := ep.prog.steps()
	if first == 0 || first >= len(ep.steps) || ep.Planned() {
		t.Fatalf("%d of %d steps planned before the planner was released, want the first window", first, len(ep.steps))
	}
	if got := len(ep.PlanFrom(first).Steps); got != 0 {
		t.Errorf("planFrom(%d) has %d steps before they are planned", first, got)
	}
	book := NewBook(nil, nil)
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
