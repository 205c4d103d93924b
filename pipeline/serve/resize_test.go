package serve

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/proto"
)

// TestResizeService trains part of an epoch at one dp, checkpoints a step
// behind the acknowledgements, and resumes it with a service started at
// another dp: refused without AllowResize; with it, the ranks of the new
// layout (registering concurrently) get the rest of the epoch, and every
// sample is applied once across the resize.
func TestResizeService(t *testing.T) {
	for _, tc := range []struct {
		name         string
		from, to, mp int
		mixture      bool
	}{{"2to1", 2, 1, 1, false}, {"1to2", 1, 2, 1, false}, {"4to2", 4, 2, 1, false}, {"4to8", 4, 8, 1, false},
		{"2to1_mp2", 2, 1, 2, false}, {"2to4_mixture", 2, 4, 1, true}} {
		t.Run(tc.name, func(t *testing.T) { testResizeService(t, tc.from, tc.to, tc.mp, tc.mixture) })
	}
}

// testResizeService resizes a job from dp from to dp to inside epoch 0;
// with mixture its dataset is a 6:3:1 mixture with repeated draws, whose
// every draw is applied once across the resize (docs/mixtures.md).
func testResizeService(t *testing.T, from, to, mp int, mixture bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	placement := "colocated"
	if mp == 2 {
		placement = "modality"
	}
	old := testConfig(t, corpus(t, 120), from, mp, placement)
	if mixture {
		old.Pipeline.Input = ""
		old.Pipeline.Mixture = &loader.Mixture{Sources: []loader.MixtureSource{
			{Name: "web", Path: corpus(t, 60), Weight: 6},
			{Name: "coco", Path: mixtureCorpus(t, 20, "wds", 8), Weight: 3},
			{Name: "own", Path: mixtureCorpus(t, 6, "jsonl", 9), Weight: 1},
		}}
	}
	old.Recalibrate = -1
	old.QuarantineDir = t.TempDir()
	old.Pipeline.Plan.GlobalBatch = max(8, 2*to) // micro-batches 2 of every new rank hold a sample
	r := start(t, old)
	var trs []*trainer
	for rank := range from * mp {
		trs = append(trs, newTrainer(t, old, r.s.ClientURL(), rank/mp, rank%mp))
	}
	runAll(t, trs, func(tr *trainer) error { return tr.runEpoch(ctx, 0, 3) })
	const ckpt = 2 // the trainers' checkpoint: a step behind what they acknowledged
	for _, tr := range trs {
		tr.crash()
		tr.forget(0, ckpt)
	}
	if err := r.stop(t); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("service: %v", err)
	}

	cfg := old
	cfg.Pipeline.Plan.DP = to
	cfg.Logger = testLogger(t)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Run(ctx); !errors.Is(err, ErrJobMismatch) {
		t.Fatalf("dp %d -> %d without AllowResize: %v, want ErrJobMismatch", from, to, err)
	}
	cfg.AllowResize = true
	r = start(t, cfg)
	var next []*trainer
	for rank := range to * mp {
		tr := newTrainer(t, cfg, r.s.ClientURL(), rank/mp, rank%mp)
		tr.applied[proto.BatchKey{Job: cfg.Job, Step: ckpt - 1, DPRank: -1}] = nil // resume at ckpt
		next = append(next, tr)
	}
	runAll(t, next, func(tr *trainer) error { return tr.runEpoch(ctx, 0, -1) })
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	for _, tr := range next {
		if tr.reply.DP != to {
			t.Errorf("register reply dp %d, want %d", tr.reply.DP, to)
		}
		for k := range tr.applied {
			if k.DPRank >= 0 && k.Step < ckpt {
				t.Errorf("rank %d applied %v, before the resize point %d", tr.dp, k, ckpt)
			}
		}
	}
	info := storedInfo(t, r.s.ClientURL(), cfg)
	if info.Resize == nil || info.Resize.FromStep != ckpt || info.Resize.DP != to || info.DP != from {
		t.Errorf("stored epoch info dp %d resize %+v: want dp %d resized to %d from step %d", info.DP, info.Resize, from, to, ckpt)
	}
	realOnce(t, append(trs, next...), 0, shardExpectation(t, old, 0), len(quarantinedIDs(t, old.QuarantineDir, 0)))
}

// runAll runs fn for every trainer concurrently and fails on any error.
func runAll(t *testing.T, trs []*trainer, fn func(*trainer) error) {
	t.Helper()
	errs := make([]error, len(trs))
	var wg sync.WaitGroup
	for i, tr := range trs {
		wg.Go(func() { errs[i] = fn(tr) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("trainer %d: %v", i, err)
		}
	}
}

// TestResizeTwiceRefused: a job resized from dp 4 to dp 2 inside epoch 0 and
// restarted at dp 8 inside the same epoch is refused at the first register
// (ErrResizeTwice: the epoch records one resize) without writing anything:
// the dp-2 trainers then finish the epoch under a service at dp 2, and every
// sample is applied once across both restarts.
func TestResizeTwiceRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	old := testConfig(t, corpus(t, 120), 4, 1, "colocated")
	old.Recalibrate = -1
	old.QuarantineDir = t.TempDir()
	old.Pipeline.Plan.GlobalBatch = 16 // 8 ranks x 2 micro-batches
	phase := func(cfg Config, dp, ckptBefore, stopAfter int) (*running, []*trainer) {
		r := start(t, cfg)
		var trs []*trainer
		for rank := range dp {
			tr := newTrainer(t, cfg, r.s.ClientURL(), rank, 0)
			if ckptBefore > 0 {
				tr.applied[proto.BatchKey{Job: cfg.Job, Step: ckptBefore - 1, DPRank: -1}] = nil
			}
			trs = append(trs, tr)
		}
		if stopAfter != 0 {
			runAll(t, trs, func(tr *trainer) error { return tr.runEpoch(ctx, 0, stopAfter) })
		}
		return r, trs
	}
	crash := func(r *running, trs []*trainer, ckpt int) {
		for _, tr := range trs {
			tr.crash()
			tr.forget(0, ckpt)
		}
		if err := r.stop(t); err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("service: %v", err)
		}
	}
	r, at4 := phase(old, 4, 0, 3)
	crash(r, at4, 2)
	at2cfg := old
	at2cfg.Pipeline.Plan.DP, at2cfg.AllowResize = 2, true
	r, at2 := phase(at2cfg, 2, 2, 2) // steps 2 and 3 at dp 2
	crash(r, at2, 3)

	at8cfg := at2cfg
	at8cfg.Pipeline.Plan.DP = 8
	r, at8 := phase(at8cfg, 8, 3, 0)
	if err := at8[0].runEpoch(ctx, 0, -1); err == nil || !strings.Contains(err.Error(), ErrResizeTwice.Error()) {
		t.Fatalf("register at dp 8 inside the resized epoch: %v, want %v", err, ErrResizeTwice)
	}
	crash(r, at8, 3)
	if info := storedInfo(t, "", at8cfg); info.Resize == nil || info.Resize.DP != 2 || info.Resize.FromStep != 2 {
		t.Fatalf("the refused resize changed the stored epoch info: %+v", info.Resize)
	}

	at2cfg.AllowResize = false // the job record still says dp 2: no resize
	r, rest := phase(at2cfg, 2, 3, 0)
	runAll(t, rest, func(tr *trainer) error { return tr.runEpoch(ctx, 0, -1) })
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	realOnce(t, slices.Concat(at4, at2, rest), 0, shardExpectation(t, old, 0), len(quarantinedIDs(t, old.QuarantineDir, 0)))
}
