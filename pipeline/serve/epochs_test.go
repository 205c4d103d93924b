package serve

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// Epoch e+1 is planned while epoch e is published, and its preprocessing
// starts while the last steps of e are handed out, so the batches go on
// across the boundary without a pause for planning. What is left at the
// boundary is refilling the preprocessing pipeline: about one step's latency
// through it (three mean intervals between steps; two steps are prepared
// ahead) on a quiet machine, more when other jobs load the cores. The test
// fails when the gap exceeds that, a quarter of the time planning the epoch
// took (the gap without planning ahead is the whole of it) and
// gapNoiseFloor. Since the dataset is opened once per job, planning epoch 1
// takes tens of milliseconds, so the timing alone can no longer tell
// planning ahead from not: the timing-free check (no batch of epoch 0's last
// step before epoch 1's planning started) is what guards it.
const gapNoiseFloor = 50 * time.Millisecond // scheduling noise on the shared 2-core machine
func TestNoGapAtTheEpochBoundary(t *testing.T) {
	cfg := testConfig(t, corpus(t, 400), 2, 1, "colocated")
	cfg.Epochs, cfg.Recalibrate = 2, -1
	cfg.Pipeline.Plan.GlobalBatch = 4
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	first := map[int]time.Time{} // per epoch
	last := map[int]time.Time{}
	notAhead := 0 // batches of epoch 0's last step handed over before epoch 1's planning started
	s.publisher.SetBuilt(func(k proto.BatchKey) {
		mu.Lock()
		defer mu.Unlock()
		if k.Epoch == 0 && k.Step == s.epochs.Steps(0)-1 && !s.epochs.Started(1) {
			notAhead++
		}
		now := time.Now()
		if _, ok := first[k.Epoch]; !ok {
			first[k.Epoch] = now
		}
		last[k.Epoch] = now
	})
	r := startService(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	runTrainersConn(t, ctx, cfg, r.s.ClientURL(), []int{0, 1}, false)
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if notAhead > 0 {
		t.Errorf("%d batches of epoch 0's last step were handed over before epoch 1 was being planned", notAhead)
	}
	steps := s.epochs.Steps(0)
	perStep := last[0].Sub(first[0]) / time.Duration(steps-1)
	gap := first[1].Sub(last[0])
	plan := time.Duration(s.epochs.PlanSeconds(1) * float64(time.Second))
	t.Logf("epoch 0: %d steps, %v a step; gap at the boundary %v; planning epoch 1 took %v", steps, perStep, gap, plan)
	if gap > max(3*perStep, plan/4, gapNoiseFloor) {
		t.Errorf("gap at the epoch boundary %v: more than a step's latency (3 × %v), a quarter of the planning time %v and %v", gap, perStep, plan, gapNoiseFloor)
	}
}
