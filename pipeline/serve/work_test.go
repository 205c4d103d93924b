package serve

import (
	"bytes"
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A planner and two workers in-process: worker A starts with the planner
// and is killed in the middle of an item (it built the rows and dies before
// sending them); worker B joins late, after A finished some items, and takes
// over A's unfinished item when its ack deadline passes. Every rank gets
// every micro-batch once, in plan order, with rows identical to what
// `mmfeed shard` writes, and every sample is applied once, dropped or
// quarantined.
func TestPlannerWorkersJoinLateLeaveEarly(t *testing.T) {
	input := corpus(t, 120)
	cfg := testConfig(t, input, 2, 1, "colocated")
	cfg.Role, cfg.WorkAckWait, cfg.WorkAhead = RolePlanner, 400*time.Millisecond, 3
	cfg.Recalibrate = -1
	cfg.QuarantineDir = t.TempDir()
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	var aDone atomic.Int32
	var killedItem atomic.Value
	bJoin := make(chan struct{})
	const killAt = 5
	startWorker := func(name string, hook func(*work.BatchItem) error) chan error {
		errc := make(chan error, 1)
		wc := work.WorkerConfig{NATS: natsenv.Config{URLs: []string{r.s.ClientURL()}}, Slots: 1, Logger: testLogger(t).With("worker", name), BeforeSend: hook}
		go func() { errc <- work.RunWorker(ctx, wc) }()
		return errc
	}
	aErr := startWorker("a", func(it *work.BatchItem) error {
		n := aDone.Add(1)
		if n == 2 {
			close(bJoin)
		}
		if n == killAt {
			killedItem.Store(it.ID)
			return work.ErrKilled
		}
		return nil
	})
	var bItems sync.Map
	var bErr chan error
	go func() {
		<-bJoin
		bErr = startWorker("b", func(it *work.BatchItem) error { bItems.Store(it.ID, true); return nil })
	}()

	trs := runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0})
	if err := <-aErr; !errors.Is(err, work.ErrKilled) {
		t.Fatalf("worker a: %v, want killed", err)
	}
	id, _ := killedItem.Load().(string)
	if _, ok := bItems.Load(id); id == "" || !ok {
		t.Errorf("worker b never took the item worker a died on (%q)", id)
	}
	quarantined := quarantinedInBucket(t, r.s.ClientURL(), cfg.Job)
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("planner: %v", err)
	}
	cancel()
	if err := <-bErr; err != nil {
		t.Errorf("worker b: %v", err)
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	realOnce(t, trs, 0, ex, quarantined)
	want := float64(ex.steps * cfg.Pipeline.Plan.DP * cfg.Pipeline.Plan.MicroBatches)
	mfs, err := r.s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got, secs := map[string]float64{}, map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "mmfeed_serve_work_items_total":
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			case "mmfeed_serve_work_item_seconds_total":
				secs[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	wt := r.s.WorkTimes()
	t.Logf("work items %v, times %+v, seconds %v", got, wt, secs)
	if wt.Items == 0 || wt.MeasuredMS <= 0 || wt.PredictedMS <= 0 || wt.FeatureEntries == 0 || wt.FeatureSeconds <= 0 || len(wt.CostMS) != balancer.WorkDims {
		t.Errorf("no predicted and measured item times: %+v", wt)
	}
	timed := counter(t, r.s, "mmfeed_serve_work_items_timed_total")
	if n := float64(wt.Items); timed != n || math.Abs(secs["measured"]/n*1e3-wt.MeasuredMS) > 1e-6 ||
		math.Abs(secs["predicted"]/n*1e3-wt.PredictedMS) > 1e-6 || math.Abs(secs["abs_error"]/n*1e3-wt.AbsErrorMS) > 1e-6 {
		t.Errorf("/metrics: %v items timed, seconds %v; WorkTimes %+v", timed, secs, wt)
	}
	if got["issued"] != want || got["results"] != want {
		t.Errorf("work items %v, want one issued and one result per (step, dp, micro-batch) = %v", got, want)
	}
}

// quarantinedInBucket counts the job's quarantine records: the planner's
// and the workers'.
func quarantinedInBucket(t *testing.T, url, job string) int {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, QuarantineBucket(job))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.Keys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		t.Fatal(err)
	}
	return len(keys)
}

// Every role computes the features once per dataset fingerprint: a second
// job on the same dataset and settings (after the first, on the same
// JetStream store) takes them from the feature bucket and delivers the same
// rows; a job with another tokenizer setting computes them again.
func TestFeatureCacheAcrossJobs(t *testing.T) {
	input := corpus(t, 80)
	for _, role := range []string{RolePlanner, RoleAll} {
		t.Run(role, func(t *testing.T) {
			cfg := testConfig(t, input, 2, 1, "colocated")
			cfg.Role, cfg.Recalibrate = role, -1
			if role == RolePlanner {
				cfg.LocalWorkers = 2
			}
			ex := shardExpectation(t, cfg, 0)
			for i, job := range []string{"job-1", "job-2", "job-3"} {
				cfg.Job = job
				if i == 2 {
					cfg.Pipeline.Tokenizer.MaxLength = 24 // another fingerprint
				}
				r := start(t, cfg)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				trs := runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0})
				cancel()
				if err := r.wait(t, 30*time.Second); err != nil {
					t.Fatalf("%s: %v", job, err)
				}
				if i < 2 {
					checkDelivery(t, cfg, trs, 0, ex)
				}
				cached := i == 1
				hits, misses := r.s.featureCache().Hits(), r.s.featureCache().Misses()
				if want := [2]int64{b2i(cached), b2i(!cached)}; [2]int64{hits, misses} != want {
					t.Errorf("%s: %d feature passes from the cache, %d computed; want %d, %d", job, hits, misses, want[0], want[1])
				}
				if fe := r.s.WorkTimes().FeatureEntries; role == RolePlanner && (fe == 0) != cached {
					t.Errorf("%s: the workers computed features of %d entries", job, fe)
				}
			}
		})
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// A standby planner takes over mid-epoch from a leading planner while the
// same two workers keep working: it takes the features from the cache,
// issues the items again from each rank's position, and every sample is
// still applied once, in plan order.
func TestStandbyPlannerWithWorkers(t *testing.T) {
	ns := externalServer(t, -1, t.TempDir())
	defer ns.Shutdown()
	cfg := testConfig(t, corpus(t, 120), 2, 1, "colocated")
	cfg.Role, cfg.WorkAckWait = RolePlanner, 400*time.Millisecond
	cfg.Recalibrate, cfg.LeaseTTL = -1, time.Second
	cfg.Logger = testLogger(t).With("planner", "leader")
	cfg.NATS = natsenv.Config{URLs: []string{ns.ClientURL()}, ReconnectWait: 50 * time.Millisecond}
	cfg.StreamMaxBytes = 256 << 10 // a few steps ahead, so the takeover happens mid-epoch
	leader := start(t, cfg)
	standbyCfg := cfg
	standbyCfg.Logger = testLogger(t).With("planner", "standby")
	standby, err := New(standbyCfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	serr := make(chan error, 1)
	go func() { serr <- standby.Run(ctx) }()
	werrs := make(chan error, 2)
	for i := range 2 {
		wc := work.WorkerConfig{NATS: natsenv.Config{URLs: []string{ns.ClientURL()}}, Slots: 1, Logger: testLogger(t).With("worker", i)}
		go func() { werrs <- work.RunWorker(ctx, wc) }()
	}
	trs := []*trainer{newTrainer(t, cfg, ns.ClientURL(), 0, 0), newTrainer(t, cfg, ns.ClientURL(), 1, 0)}
	var wg sync.WaitGroup
	errs := make([]error, len(trs))
	for i, tr := range trs {
		tr.stepDelay = 40 * time.Millisecond
		wg.Go(func() {
			errs[i] = tr.runEpoch(ctx, 0, -1) // lives through the takeover
			tr.crash()
		})
	}
	checkFor(t, 60*time.Second, 20*time.Millisecond, func() error { // generous: a loaded machine
		if n := counter(t, leader.s, "mmfeed_serve_batches_total"); n < 8 {
			return errorf("%v batches published", n)
		}
		return nil
	})
	if err := leader.stop(t); err != nil {
		t.Fatalf("leader: %v", err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("trainer %d: %v", i, err)
		}
	}
	quarantined := quarantinedInBucket(t, ns.ClientURL(), cfg.Job)
	select {
	case err := <-serr:
		if err != nil {
			t.Fatalf("standby: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the standby did not finish")
	}
	cancel()
	for range 2 {
		if err := <-werrs; err != nil {
			t.Errorf("worker: %v", err)
		}
	}
	if hits := standby.featureCache().Hits(); hits != 1 {
		t.Errorf("the standby took the features from the cache %d times, want 1", hits)
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	realOnce(t, trs, 0, ex, quarantined)
}

// The planner role on both data planes and with two mp ranks per dp rank
// (modality placement: each worker result carries one batch per mp rank),
// and with dynamic resolution, with local workers: every rank gets the rows
// `mmfeed shard` writes, in its modality's columns, and the planner rejects
// none of the honest workers' results (including the rows of samples that
// failed on a worker: weight 0, zero pixels).
func TestPlannerLayouts(t *testing.T) {
	for _, tc := range []struct {
		name, plane, placement, policy string
		mp                             int
	}{
		{"jetstream", "jetstream", "colocated", "", 1},
		{"modality", "core", "modality", "", 2},
		{"dynamic", "core", "modality", "dynamic", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, corpus(t, 60), 2, tc.mp, tc.placement)
			cfg.Role, cfg.LocalWorkers, cfg.Recalibrate, cfg.DataPlane = RolePlanner, 2, -1, tc.plane
			if tc.policy != "" {
				cfg.Pipeline.Image.Policy, cfg.Pipeline.Image.MaxPixels = tc.policy, 64*64
			}
			r := start(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			trs := runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0})
			quarantined := quarantinedInBucket(t, r.s.ClientURL(), cfg.Job)
			if err := r.wait(t, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			ex := shardExpectation(t, cfg, 0)
			checkDelivery(t, cfg, trs, 0, ex)
			realOnce(t, trs, 0, ex, quarantined)
			if n := familySum(t, r.s, "mmfeed_serve_work_results_rejected_total"); n != 0 {
				t.Errorf("%v honest results rejected", n)
			}
		})
	}
}

// A planner's payloads, built by workers, are byte for byte those of
// --role all; one the planner no longer holds is regenerated by the
// workers with the next generation, again byte-identical.
func TestPlannerPayloadsEqualRoleAll(t *testing.T) {
	input := corpus(t, 48)
	fetchAll := func(role string) (first, again [][]byte) {
		cfg := testConfig(t, input, 1, 1, "colocated")
		cfg.Recalibrate, cfg.Role = -1, role
		if role == RolePlanner {
			cfg.LocalWorkers = 1
		}
		r := start(t, cfg)
		defer r.stop(t)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		tr := newTrainer(t, cfg, r.s.ClientURL(), 0, 0)
		if err := tr.connect(ctx); err != nil {
			t.Fatal(err)
		}
		defer tr.crash()
		if rep, err := tr.register(ctx, 0, 0); err != nil || !rep.OK {
			t.Fatalf("register: %+v, %v", rep, err)
		}
		rank := newRawRank(t, r.s.ClientURL(), cfg.Job, 0)
		for step := range 3 {
			for mb := range 2 {
				_, p := rank.fetch(0, step, mb)
				first = append(first, p)
			}
		}
		rank.ack(0, 2, 1)
		checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			if k, held := firstHeld(r.s, 0); held && k.Step <= 2 {
				return errorf("outbox still holds %v", k)
			}
			return nil
		})
		for i, step := range []int{1, 1, 2, 2} { // a restart from the checkpoint of step 0
			h, p := rank.fetch(0, step, i%2)
			if h.Gen != 1 {
				t.Errorf("%s: regenerated %v has generation %d, want 1", role, h.BatchKey, h.Gen)
			}
			again = append(again, p)
		}
		return first, again
	}
	allFirst, allAgain := fetchAll(RoleAll)
	plFirst, plAgain := fetchAll(RolePlanner)
	for i := range allFirst {
		if !bytes.Equal(plFirst[i], allFirst[i]) {
			t.Errorf("batch %d: the planner's %d bytes differ from role all's %d", i, len(plFirst[i]), len(allFirst[i]))
		}
	}
	for i := range allAgain {
		if !bytes.Equal(plAgain[i], allAgain[i]) || !bytes.Equal(plAgain[i], allFirst[2+i]) {
			t.Errorf("regenerated batch %d differs", i)
		}
	}
}
