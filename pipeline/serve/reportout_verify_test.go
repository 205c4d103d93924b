package serve

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// TestFailedStartDoesNotRecordTheJob: a service started with a wrong input
// fails, and a service with the right input and the same data dir and job
// then starts and serves (the wrong input's fingerprint was not recorded).
func TestFailedStartDoesNotRecordTheJob(t *testing.T) {
	good := corpus(t, 60)
	bad := testConfig(t, filepath.Join(t.TempDir(), "missing.jsonl"), 2, 1, "colocated")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := New(bad)
	if err == nil {
		err = s.Run(ctx)
	}
	if err == nil || ctx.Err() != nil {
		t.Fatalf("a start with a missing input: %v (ctx %v), want an error", err, ctx.Err())
	}
	cfg := bad
	cfg.Pipeline.Input = good
	r := start(t, cfg)
	trs := runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0})
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("the start with the right input: %v", err)
	}
	checkDelivery(t, cfg, trs, 0, shardExpectation(t, cfg, 0))
}

// TestCleanEndRefusalNotAtInfo: the register a trainer sends for the epoch
// after the job's last (how it learns the job has no more) is refused
// without an INFO line.
func TestCleanEndRefusalNotAtInfo(t *testing.T) {
	cfg := testConfig(t, corpus(t, 60), 1, 1, "colocated")
	var logs lockedBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr := newTrainer(t, cfg, r.s.ClientURL(), 0, 0)
	if err := tr.connect(ctx); err != nil {
		t.Fatal(err)
	}
	defer tr.crash()
	l := cfg.layout()
	rep, err := registerWith(ctx, tr.nc, cfg.Job, proto.Register{Job: cfg.Job, Epoch: 1, DP: l.DP, MP: l.MP, Placement: l.Placement})
	if err != nil || rep.OK || !strings.Contains(rep.Error, "outside the job's epochs") {
		t.Fatalf("register for epoch 1 of a one-epoch job: %+v %v, want refused outside the job's epochs", rep, err)
	}
	if strings.Contains(logs.String(), "register refused") {
		t.Errorf("the clean end's refusal is logged at INFO or above:\n%s", logs.String())
	}
}

// TestJobMismatchNamesWhatChanged: a refused job record names the settings
// that changed, not only two fingerprints.
func TestJobMismatchNamesWhatChanged(t *testing.T) {
	c := DefaultConfig()
	c.Job, c.Pipeline.Input = "job-1", "data.jsonl"
	rec, err := c.jobRecord()
	if err != nil {
		t.Fatal(err)
	}
	old := rec
	old.Settings = nil // a record written before settings were named
	tests := []struct {
		name   string
		edit   func(*Config)
		stored JobRecord
		want   []string
		lacks  string
	}{
		{"seed", func(c *Config) { c.Pipeline.Plan.Seed = 9 }, rec, []string{"changed: Plan.seed ("}, "Input"},
		{"image size", func(c *Config) { c.Pipeline.Image.Size = 64 }, rec, []string{"changed: Image.Size ("}, "Plan."},
		{"input", func(c *Config) { c.Pipeline.Input = "other.jsonl" }, rec, []string{"changed: Input ("}, "Image."},
		{"dp and seed", func(c *Config) { c.Pipeline.Plan.DP = 4; c.Pipeline.Plan.Seed = 9 }, rec, []string{"dp 8 → 4", "Plan.seed", "Plan.dp"}, "Input"},
		{"old record", func(c *Config) { c.Pipeline.Plan.Seed = 9 }, old, []string{"predates naming them"}, "Plan.seed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := c
			tc.edit(&d)
			r, _ := d.jobRecord()
			err := r.compatible(tc.stored)
			if !errors.Is(err, ErrJobMismatch) {
				t.Fatalf("got %v, want ErrJobMismatch", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v: does not name %q", err, w)
				}
			}
			if strings.Contains(err.Error(), tc.lacks) {
				t.Errorf("%v: names %q, which did not change", err, tc.lacks)
			}
		})
	}
}
