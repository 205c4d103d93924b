package serve

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/tokenize"
)

// The service opens the dataset once per job (index, tokenizer, features)
// and plans every epoch from it: after epoch 0 is planned the manifest and
// the tokenizer file are removed, and epochs 1 and 2 are still planned and
// served exactly as `mmfeed shard` plans them (from the files as they were),
// with the feature cache read or filled once, and each epoch's quarantine
// file holding its rejects once.
func TestServeOpensDatasetOnce(t *testing.T) {
	for _, role := range []string{RoleAll, RolePlanner} {
		t.Run(role, func(t *testing.T) {
			testServeOpensDatasetOnce(t, role)
		})
	}
}

func testServeOpensDatasetOnce(t *testing.T, role string) {
	src := corpus(t, 120)
	cfg := testConfig(t, src, 2, 1, "colocated")
	cfg.Epochs, cfg.Recalibrate = 3, -1
	cfg.QuarantineDir = t.TempDir()
	if role == RolePlanner {
		cfg.Role, cfg.LocalWorkers = RolePlanner, 2
	}
	tok, err := tokenize.DefaultTokenizerPath()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(tok)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Pipeline.Tokenizer.Path = filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(cfg.Pipeline.Tokenizer.Path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var exs []expected // the plans, from the files before they are removed
	for e := range cfg.Epochs {
		exs = append(exs, shardExpectation(t, cfg, e))
	}
	r := start(t, cfg)
	checkFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		if _, ok := r.s.epochs.Info(0); !ok {
			return errorf("epoch 0 not planned")
		}
		return nil
	})
	ds, err := r.s.data.get(context.Background(), r.s.cfg.Pipeline) // the one epoch 0 opened
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{src, cfg.Pipeline.Tokenizer.Path} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	trs := runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0, 1, 2})
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	for e, ex := range exs {
		checkDelivery(t, cfg, trs, e, ex)
		realOnce(t, trs, e, ex, len(quarantinedIDs(t, cfg.QuarantineDir, e)))
		checkQuarantineOnce(t, cfg.QuarantineDir, e)
	}
	if r.s.data.opens != 1 || ds.FeaturePasses() != 1 {
		t.Errorf("%d datasets opened, %d feature passes, want one of each per job", r.s.data.opens, ds.FeaturePasses())
	}
	if c := r.s.featureCache(); c.Hits()+c.Misses() != 1 {
		t.Errorf("feature cache read %d times (%d hits, %d misses), want once per job", c.Hits()+c.Misses(), c.Hits(), c.Misses())
	}
	if role == RolePlanner {
		n := r.s.WorkTimes().FeatureEntries
		if want := len(regexp.MustCompile(`(?m)^\{`).FindAll(manifest, -1)); n > want {
			t.Errorf("the workers computed the features of %d entries, want one pass (at most %d)", n, want)
		}
	}
}

// TestPlanEpochSeconds logs how long each epoch's planning takes on a
// corpus of MMFEED_PLAN_SAMPLES generated samples (or MMFEED_PLAN_INPUT)
// over 3 epochs: a measurement, not a check.
func TestPlanEpochSeconds(t *testing.T) {
	input := os.Getenv("MMFEED_PLAN_INPUT")
	if n, _ := strconv.Atoi(os.Getenv("MMFEED_PLAN_SAMPLES")); n > 0 && input == "" {
		input = corpus(t, n)
	}
	if input == "" {
		t.Skip("set MMFEED_PLAN_SAMPLES or MMFEED_PLAN_INPUT")
	}
	cfg := testConfig(t, input, 2, 1, "colocated")
	cfg.Pipeline.Plan.GlobalBatch = 32
	cfg.Epochs, cfg.Recalibrate = 3, -1
	var logs lockedBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0, 1, 2})
	if err := r.wait(t, 60*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	for _, m := range regexp.MustCompile(`msg="planned epoch" .*?epoch=(\d+) .*seconds=([\d.e-]+)`).FindAllStringSubmatch(logs.String(), -1) {
		t.Logf("planned epoch %s in %s s", m[1], m[2])
	}
}

// BenchmarkPlanEpoch orders and plans one epoch of an opened dataset (what
// every epoch after the first costs the service): MMFEED_PLAN_INPUT, or
// 3000 generated samples.
func BenchmarkPlanEpoch(b *testing.B) {
	input := os.Getenv("MMFEED_PLAN_INPUT")
	if input == "" {
		input = corpus(b, 3000)
	}
	cfg := testConfig(b, input, 2, 1, "colocated")
	cfg.Pipeline.Plan.GlobalBatch = 32
	ds, err := pipeline.OpenDataset(context.Background(), cfg.Pipeline, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer ds.Close()
	if _, err := ds.Epoch(context.Background(), cfg.Pipeline.Plan, nil); err != nil { // the feature pass
		b.Fatal(err)
	}
	b.ResetTimer()
	for e := range b.N {
		ep, err := epochs.Prepare(context.Background(), cfg.epochConfig(), ds, e, nil, cfg.Pipeline.Plan.Model, nil)
		if err != nil {
			b.Fatal(err)
		}
		ep.Close()
	}
}
