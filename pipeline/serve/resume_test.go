package serve

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// counter returns the value of a counter (or gauge) without labels.
func counter(t testing.TB, s *Service, name string) float64 {
	t.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) > 0 {
			m := mf.Metric[0]
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	return 0
}

// TestTrainerRestart kills two trainer ranks mid-epoch: rank 0 resumes from
// its last acknowledged step, rank 1 from a checkpoint two steps older than
// its acknowledgements (the service republishes those steps with a new
// generation). Nothing is lost or applied twice.
// dataPlanes are the data planes the resume tests run on.
var dataPlanes = []string{proto.DataPlaneCore, proto.DataPlaneJetStream}

func TestTrainerRestart(t *testing.T) {
	for _, plane := range dataPlanes {
		t.Run(plane, func(t *testing.T) { testTrainerRestart(t, plane) })
	}
}

func testTrainerRestart(t *testing.T, plane string) {
	cfg := testConfig(t, corpus(t, 120), 2, 1, "colocated")
	cfg.DataPlane = plane
	cfg.Recalibrate = -1
	cfg.QuarantineDir = t.TempDir()
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	trs := []*trainer{newTrainer(t, cfg, r.s.ClientURL(), 0, 0), newTrainer(t, cfg, r.s.ClientURL(), 1, 0)}
	plan := []struct{ stopAfter, checkpointLag int }{{4, 0}, {6, 2}}
	var wg sync.WaitGroup
	errs := make([]error, len(trs))
	for i, tr := range trs {
		wg.Go(func() {
			if errs[i] = tr.runEpoch(ctx, 0, plan[i].stopAfter); errs[i] != nil {
				return
			}
			tr.crash()
			tr.forget(0, tr.resumeStep(0)-plan[i].checkpointLag)
			errs[i] = tr.runEpoch(ctx, 0, -1)
			tr.crash()
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("trainer %d: %v", i, err)
		}
	}
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	realOnce(t, trs, 0, ex, len(quarantinedIDs(t, cfg.QuarantineDir, 0)))
	if got := counter(t, r.s, "mmfeed_serve_rewinds_total"); got < 1 {
		t.Errorf("rewinds %v: the rank whose checkpoint lagged its acks needs one", got)
	}
}

// TestServiceRestart stops the service mid-epoch while trainers consume and
// starts a new one on the same data dir and port: the trainers' connections
// reconnect, the service resumes from the KV state and the stream, and every
// batch is applied exactly once.
func TestServiceRestart(t *testing.T) {
	for _, plane := range dataPlanes {
		t.Run(plane, func(t *testing.T) { testServiceRestart(t, plane) })
	}
}

func testServiceRestart(t *testing.T, plane string) {
	cfg := testConfig(t, corpus(t, 120), 2, 1, "colocated")
	cfg.DataPlane = plane
	cfg.Recalibrate = -1
	cfg.QuarantineDir = t.TempDir()
	cfg.NATS.Listen = "127.0.0.1:" + itoa(freePort(t))
	cfg.StreamMaxBytes = 256 << 10 // a few steps ahead, so the restart happens mid-epoch
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	trs := []*trainer{newTrainer(t, cfg, r.s.ClientURL(), 0, 0), newTrainer(t, cfg, r.s.ClientURL(), 1, 0)}
	var wg sync.WaitGroup
	errs := make([]error, len(trs))
	for i, tr := range trs {
		tr.stepDelay = 40 * time.Millisecond
		wg.Go(func() {
			errs[i] = tr.runEpoch(ctx, 0, -1) // lives through the service restart
			tr.crash()
		})
	}
	checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := counter(t, r.s, "mmfeed_serve_batches_total"); n < 8 {
			return errorf("%v batches published", n)
		}
		return nil
	})
	if err := r.stop(t); err != nil {
		t.Fatalf("stop: %v", err)
	}
	r2 := start(t, cfg)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("trainer %d: %v", i, err)
		}
	}
	if err := r2.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	realOnce(t, trs, 0, ex, len(quarantinedIDs(t, cfg.QuarantineDir, 0)))
	checkQuarantineOnce(t, cfg.QuarantineDir, 0) // the restart planned the epoch again
}

// externalServer runs a JetStream server standing for an existing NATS
// deployment, on a fixed port and store dir so it can come back.
func externalServer(t testing.TB, port int, dir string) *server.Server {
	t.Helper()
	return testnats.Server(t, testnats.Options{Port: port, StoreDir: dir})
}

// TestExternalNATSOutage serves through an external server that goes away
// mid-epoch and comes back on the same port and store: the service and the
// trainers reconnect and finish with every batch exactly once. The long
// outage lasts three lease TTLs: the service is fenced (no state writes)
// while NATS is away, takes its lease back when it returns (nobody else
// wrote it) and goes on instead of stopping with ErrLeaseLost (a service
// exited with "job lease lost" after 8 s of outage before).
func TestExternalNATSOutage(t *testing.T) {
	for _, tc := range []struct {
		name     string
		down     time.Duration
		leaseTTL time.Duration
	}{
		{"blip", 300 * time.Millisecond, 5 * time.Second},
		{"longer-than-the-lease", 3 * time.Second, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) { externalOutage(t, tc.down, tc.leaseTTL) })
	}
}

func externalOutage(t *testing.T, down, leaseTTL time.Duration) {
	port, dir := freePort(t), t.TempDir()
	ns := externalServer(t, port, dir)
	defer func() { ns.Shutdown() }()
	cfg := testConfig(t, corpus(t, 120), 2, 1, "colocated")
	cfg.Recalibrate = -1
	cfg.QuarantineDir = t.TempDir()
	cfg.NATS = natsenv.Config{URLs: []string{ns.ClientURL()}, ReconnectWait: 50 * time.Millisecond}
	cfg.StreamMaxBytes = 256 << 10
	cfg.Publisher.AckTimeout = time.Second
	cfg.LeaseTTL = leaseTTL
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	trs := []*trainer{newTrainer(t, cfg, ns.ClientURL(), 0, 0), newTrainer(t, cfg, ns.ClientURL(), 1, 0)}
	var wg sync.WaitGroup
	errs := make([]error, len(trs))
	for i, tr := range trs {
		tr.stepDelay = 40 * time.Millisecond
		wg.Go(func() {
			errs[i] = tr.runEpoch(ctx, 0, -1) // lives through the outage
			tr.crash()
		})
	}
	checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := counter(t, r.s, "mmfeed_serve_batches_total"); n < 8 {
			return errorf("%v batches published", n)
		}
		return nil
	})
	ns.Shutdown()
	ns.WaitForShutdown()
	time.Sleep(down) // an outage, not a blip
	ns = externalServer(t, port, dir)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("trainer %d: %v", i, err)
		}
	}
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	realOnce(t, trs, 0, ex, len(quarantinedIDs(t, cfg.QuarantineDir, 0)))
}

// TestLeaseTakenDuringAnOutage: while NATS is away for longer than the
// lease TTL another service takes the lease; when NATS returns the fenced
// service finds the lease written by someone else and stops with
// ErrLeaseLost (its trainers move to the new leader) instead of writing
// under a lease it no longer holds.
func TestLeaseTakenDuringAnOutage(t *testing.T) {
	port, dir := freePort(t), t.TempDir()
	ns := externalServer(t, port, dir)
	defer func() { ns.Shutdown() }()
	cfg := testConfig(t, corpus(t, 40), 1, 1, "colocated")
	cfg.Recalibrate = -1
	cfg.NATS = natsenv.Config{URLs: []string{ns.ClientURL()}, ReconnectWait: 2 * time.Second}
	cfg.LeaseTTL = 500 * time.Millisecond
	r := start(t, cfg)
	<-r.s.Ready()
	ns.Shutdown()
	ns.WaitForShutdown()
	time.Sleep(time.Second) // past the TTL: the service is fenced
	ns = externalServer(t, port, dir)
	_, js := testnats.Connect(t, ns.ClientURL()) // the other service, first back
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, natsenv.LeaseBucket(cfg.Job))
	if err != nil {
		t.Fatal(err)
	}
	taken, err := kv.Put(ctx, natsenv.LeaseKey, []byte("another-service"))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.wait(t, 20*time.Second); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("service after another took its lease: %v, want ErrLeaseLost", err)
	}
	st, err := kv.Status(ctx) // the key itself expires (nobody renews it)
	if err != nil {
		t.Fatal(err)
	}
	if last := st.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq; last != taken {
		t.Errorf("lease bucket's last write %d, want the other service's %d: the fenced service wrote it", last, taken)
	}
}

// TestBackpressure runs with no trainer and a small stream: publishing stops
// when the stream is full, the heap stays bounded while it waits, and
// everything is delivered once trainers appear.
func TestBackpressure(t *testing.T) {
	for _, plane := range dataPlanes {
		t.Run(plane, func(t *testing.T) { backpressure(t, plane) })
	}
}

func backpressure(t *testing.T, plane string) {
	cfg := testConfig(t, corpus(t, 160), 2, 1, "colocated")
	cfg.DataPlane = plane
	cfg.Recalibrate = -1
	cfg.QuarantineDir = t.TempDir()
	cfg.StreamMaxBytes = 512 << 10
	cfg.Pipeline.Image.Size = 64 // 24 KiB a sample: the stream holds a few steps of the 20
	r := start(t, cfg)
	held := "mmfeed_serve_outbox_bytes"
	if !cfg.core() {
		held = "mmfeed_serve_stream_bytes"
	}
	var stalled float64
	checkFor(t, 30*time.Second, 500*time.Millisecond, func() error {
		n := counter(t, r.s, "mmfeed_serve_batches_total")
		room := float64(cfg.StreamMaxBytes) - counter(t, r.s, held)
		full := n > 0 && room < 2*counter(t, r.s, "mmfeed_serve_bytes_total")/n+4096
		if n != stalled || !full {
			stalled = n
			return errorf("still publishing (%v batches, %v bytes of room)", n, room)
		}
		return nil
	})
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	h0 := heap()
	time.Sleep(500 * time.Millisecond) // the publisher keeps retrying against the full stream
	h1 := heap()
	if got := counter(t, r.s, "mmfeed_serve_batches_total"); got != stalled {
		t.Errorf("published %v batches while the stream was full (had %v)", got, stalled)
	}
	if bytes := counter(t, r.s, held); bytes > float64(cfg.StreamMaxBytes) {
		t.Errorf("stream holds %v bytes > max %d", bytes, cfg.StreamMaxBytes)
	}
	if h1 > h0+8<<20 {
		t.Errorf("heap grew from %d to %d bytes while the stream was full", h0, h1)
	}
	t.Logf("stalled at %v batches; heap %d → %d bytes", stalled, h0, h1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	trs := runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0})
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	if got := counter(t, r.s, "mmfeed_serve_batches_total"); got <= stalled {
		t.Errorf("publication did not resume: %v batches", got)
	}
}
