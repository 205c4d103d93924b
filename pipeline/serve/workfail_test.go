package serve

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestUnreachableInputFailsTheJob: a worker that cannot open the job's
// input (the planner's path does not exist on its machine) reports why
// each item fails; the planner logs the reason, gives up on the item after
// work.ItemMaxFailures reports and ends the job with ErrWorkFailed and the
// worker's reason, for a feature item (features not cached) and for a
// batch item (features from the cache), instead of issuing it forever.
// Nothing was delivered: once the input is reachable again, the same job
// runs to its end and delivers every sample once.
func TestUnreachableInputFailsTheJob(t *testing.T) {
	input := corpus(t, 40)
	for _, kind := range []string{"features", "batch"} {
		t.Run(kind, func(t *testing.T) {
			cfg := testConfig(t, input, 1, 1, "colocated")
			cfg.Pipeline.Plan.MicroBatches, cfg.Recalibrate = 1, -1
			if kind == "batch" { // a first job fills the feature cache
				cfg.Job = "job-0"
				r := start(t, cfg)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0})
				cancel()
				if err := r.wait(t, 30*time.Second); err != nil {
					t.Fatal(err)
				}
			}
			cfg.Job, cfg.Role, cfg.WorkAhead = "job-1", RolePlanner, 1
			var logs syncBuffer
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			r := start(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			waitForItem(t, ctx, r.s.ClientURL(), cfg.Job, kind)
			moved := filepath.Dir(input) + "-" + kind
			if err := os.Rename(filepath.Dir(input), moved); err != nil {
				t.Fatal(err)
			}
			wctx, wcancel := context.WithCancel(ctx)
			defer wcancel()
			go func() {
				_ = work.RunWorker(wctx, work.WorkerConfig{NATS: urlNATS(r.s.ClientURL()), Slots: 4, Logger: testLogger(t).With("worker", "remote")})
			}()
			t0 := time.Now()
			err := r.wait(t, 60*time.Second)
			if !errors.Is(err, ErrWorkFailed) || !strings.Contains(err.Error(), "no such file") {
				t.Fatalf("planner: %v, want ErrWorkFailed with the worker's reason", err)
			}
			t.Logf("gave up after %v: %v", time.Since(t0).Round(time.Millisecond), err)
			if n := strings.Count(logs.String(), "failed on a worker"); n < work.ItemMaxFailures || !strings.Contains(logs.String(), "no such file") {
				t.Errorf("the planner logged %d failures with the reason, want %d; log:\n%s", n, work.ItemMaxFailures, logs.String())
			}
			if n := labelled(t, r.s, "mmfeed_serve_work_failures_total", kind); n < work.ItemMaxFailures {
				t.Errorf("/metrics: %v failure reports of %s items, want at least %d", n, kind, work.ItemMaxFailures)
			}
			if st := r.s.Stats(); st.Batches != 0 {
				t.Errorf("%d batches delivered before the job failed", st.Batches)
			}
			wcancel()

			// With the input back, the same job runs to its end: every sample once.
			if err := os.Rename(moved, filepath.Dir(input)); err != nil {
				t.Fatal(err)
			}
			cfg.LocalWorkers, cfg.Logger = 2, testLogger(t)
			r = start(t, cfg)
			trs := runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0})
			quarantined := quarantinedInBucket(t, r.s.ClientURL(), cfg.Job)
			if err := r.wait(t, 30*time.Second); err != nil {
				t.Fatalf("planner after the input is back: %v", err)
			}
			ex := shardExpectation(t, cfg, 0)
			checkDelivery(t, cfg, trs, 0, ex)
			realOnce(t, trs, 0, ex, quarantined)
		})
	}
}

// waitForItem waits until the work queue holds an item of the job of this
// kind ("features" or "batch").
func waitForItem(t *testing.T, ctx context.Context, url, job, kind string) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		st, err := js.Stream(ctx, work.Stream)
		if err != nil {
			return err
		}
		m, err := st.GetLastMsgForSubject(ctx, work.ItemsSubject(job))
		if err != nil {
			return err
		}
		var k struct{ Kind string }
		if err := json.Unmarshal(m.Data, &k); err != nil || k.Kind != kind {
			return errorf("last item is %q (%v), want %q", k.Kind, err, kind)
		}
		return nil
	})
}
