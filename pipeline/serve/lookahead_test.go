package serve

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
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
	epochs.SetPlanWindowHook(hook)
	t.Cleanup(func() { epochs.SetPlanWindowHook(nil) })
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
