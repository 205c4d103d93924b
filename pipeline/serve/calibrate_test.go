package serve

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/report"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestRecalibrateMidEpoch has trainers report compute times from a known
// model, recalibrates every 3 steps, and checks that the rest of the epoch
// was replanned with the fitted model (recorded as a segment in the KV
// bucket), that every sample is still applied exactly once with equal steps
// per rank, and that replaying the recorded segments reproduces exactly the
// batches the trainers got (a restarted service would serve the same plan).
func TestRecalibrateMidEpoch(t *testing.T) {
	cfg := testConfig(t, corpus(t, 160), 2, 1, "colocated")
	cfg.Recalibrate = 3
	cfg.MinObservations = 8
	cfg.QuarantineDir = t.TempDir()
	cfg.CostModelOut = filepath.Join(cfg.QuarantineDir, "cost-model.json")
	cfg.StreamMaxBytes = 128 << 10 // publishing waits for the trainers, so feedback arrives mid-epoch
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	trs := runTrainersWith(t, ctx, cfg, r.s.ClientURL(), []int{0}, true, func(tr *trainer) {
		tr.computeSeconds = func(epoch, step int) float64 { return trueSeconds(tr, epoch, step) }
	})
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	info := storedInfo(t, r.s.ClientURL(), cfg)
	if len(info.Segments) < 2 || info.Segments[1].FromStep == 0 || info.Segments[1].Model.Unit != "s" || info.Segments[1].Fit == nil {
		t.Fatalf("segments %+v: want a recalibrated segment in seconds after step 0", info.Segments)
	}
	if fit := info.Segments[len(info.Segments)-1].Fit; fit.R2 < 0.9 {
		t.Errorf("last fit %+v: want R² ≥ 0.9 on noise-free times", fit)
	}
	if m, err := pipeline.LoadCostModel(cfg.CostModelOut); err != nil || m.Unit != "s" {
		t.Errorf("--cost-model-out after refits: %+v, %v; want a fitted model in seconds", m, err)
	}
	ex := shardExpectation(t, cfg, 0)
	realOnce(t, trs, 0, ex, len(quarantinedIDs(t, cfg.QuarantineDir, 0)))
	// Replaying the segments gives the steps the trainers applied.
	ep, err := epochs.PrepareWhole(ctx, cfg.epochConfig(), 0, &info, cfg.Pipeline.Plan.Model)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	items := ep.Prepared().Features.Items
	for _, tr := range trs {
		for _, s := range ep.ServedSteps() {
			for mb, entries := range s.Ranks[tr.dp] {
				k := proto.BatchKey{Job: cfg.Job, Step: s.Index, MicroBatch: mb, DPRank: tr.dp}
				got := ids(tr.applied[k])
				want := make([]string, len(entries))
				for i, e := range entries {
					want[i] = items[e.Item].ID
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%v: applied %v, the replayed plan has %v", k, got, want)
				}
			}
		}
		if s := info.Segments[1].FromStep; s > 0 {
			k := proto.BatchKey{Job: cfg.Job, Step: 0, MicroBatch: 0, DPRank: tr.dp}
			if fmt.Sprint(ids(tr.applied[k])) != fmt.Sprint(ids(ex.rows[[3]int{0, tr.dp, 0}])) {
				t.Errorf("step 0 before the recalibration differs from the base plan")
			}
		}
	}
}

// trueSeconds is the "measured" compute time of a rank-step: a fixed linear
// model of the rows' text and image tokens.
func trueSeconds(tr *trainer, epoch, step int) float64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var f balancer.Features
	for k, rows := range tr.applied {
		if k.Epoch != epoch || k.Step != step {
			continue
		}
		for _, r := range rows {
			f = f.Add(balancer.FeaturesOf(int(r.TextTokens), int(r.ImageTokens), 0))
		}
	}
	return 1e-3*f[balancer.FeatL] + 4e-6*f[balancer.FeatL2] + 2e-3*f[balancer.FeatP] + 5e-4*f[balancer.FeatOne]
}

// storedInfo reads epoch 0's info from the KV bucket of a finished job by
// starting a bare JetStream server on the service's store.
func storedInfo(t *testing.T, _ string, cfg Config) EpochInfo {
	t.Helper()
	ns, err := natsenv.StartEmbedded(context.Background(), natsenv.Config{DataDir: cfg.NATS.DataDir, MaxPayload: 1 << 20}, &natsenv.Security{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, proto.BucketName(cfg.Job))
	if err != nil {
		t.Fatal(err)
	}
	var info EpochInfo
	if ok, err := (state{kv}).getJSON(ctx, epochs.InfoKey(0), &info); err != nil || !ok {
		t.Fatalf("epoch info: ok=%v err=%v", ok, err)
	}
	if err := info.Validate(); err != nil {
		t.Fatal(err)
	}
	return info
}

// TestReportFitsAfterPublishing: with nothing left to replan (the service
// never refits for planning here, and everything is published before any
// feedback), the live report still fits the cost model to the feedback, on
// every observation, and the planner's models stay the prior.
func TestReportFitsAfterPublishing(t *testing.T) {
	cfg := testConfig(t, corpus(t, 80), 2, 1, "colocated")
	cfg.Recalibrate = -1
	cfg.MinObservations = 8
	cfg.QuarantineDir = t.TempDir()
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runTrainersWith(t, ctx, cfg, r.s.ClientURL(), []int{0}, true, func(tr *trainer) {
		tr.computeSeconds = func(epoch, step int) float64 { return trueSeconds(tr, epoch, step) }
	})
	var live report.Live
	checkFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		live = r.s.snapshot().Live
		if live.Calibration == nil || live.Calibration.Fit.N != live.Observations {
			return fmt.Errorf("calibration %+v after %d observations", live.Calibration, live.Observations)
		}
		return nil
	})
	if live.Observations < 16 || live.Calibration.Fit.R2 < 0.9 {
		t.Errorf("fit %+v on %d observations: want R² ≥ 0.9 on noise-free times", live.Calibration.Fit, live.Observations)
	}
	if len(live.Models) != 1 {
		t.Errorf("planned with %d models, want the prior only", len(live.Models))
	}
	_ = r.stop(t)
}
