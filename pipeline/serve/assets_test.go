package serve

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
)

// syncBuffer is a log destination tests read while the service writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func healthz(t testing.TB, s *Service) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + s.HTTPAddr() + "/healthz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestLostAssetsRecreated deletes the job's stream, KV bucket and quarantine
// bucket under a running service with batches stored and unconsumed: the
// service logs an error, recreates each, writes its state back, rewinds
// the ranks to what they acknowledged, and the trainers then get every
// batch exactly once.
func TestLostAssetsRecreated(t *testing.T) {
	cfg := testConfig(t, corpus(t, 120), 2, 1, "colocated")
	cfg.DataPlane = proto.DataPlaneJetStream
	cfg.Recalibrate = -1
	cfg.QuarantineDir = t.TempDir()
	cfg.StreamMaxBytes = 256 << 10
	cfg.AssetCheck = 100 * time.Millisecond
	var logs syncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r := start(t, cfg)
	checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := counter(t, r.s, "mmfeed_serve_batches_total"); n < 8 {
			return errorf("%v batches published", n)
		}
		return nil
	})
	_, js := testnats.Connect(t, r.s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for _, del := range []func() error{
		func() error { return js.DeleteStream(ctx, proto.StreamName(cfg.Job)) },
		func() error { return js.DeleteKeyValue(ctx, proto.BucketName(cfg.Job)) },
		func() error { return js.DeleteKeyValue(ctx, QuarantineBucket(cfg.Job)) },
	} {
		if err := del(); err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		for _, asset := range []string{"stream", "kv", "quarantine"} {
			if n := labelled(t, r.s, "mmfeed_serve_assets_recreated_total", asset); n < 1 {
				return errorf("%s not recreated", asset)
			}
		}
		if code, body := healthz(t, r.s); code != http.StatusOK {
			return errorf("healthz %d %q after recreation", code, body)
		}
		return nil
	})
	if !strings.Contains(logs.String(), "level=ERROR msg=\"jetstream asset lost: recreating it\"") {
		t.Errorf("no error logged for the lost assets:\n%s", logs.String())
	}
	if _, err := js.KeyValue(ctx, proto.BucketName(cfg.Job)); err != nil {
		t.Fatalf("kv bucket: %v", err)
	}
	trs := runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0})
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	realOnce(t, trs, 0, ex, len(quarantinedIDs(t, cfg.QuarantineDir, 0)))
}

// TestHealthzUnavailable: /healthz answers 503 while the service cannot
// reach NATS (an external server that went away) and its assets, with the
// asset checks' failures logged with backoff and counted, and 200 once
// the server is back.
func TestHealthzUnavailable(t *testing.T) {
	port, dir := freePort(t), t.TempDir()
	ns := externalServer(t, port, dir)
	defer func() { ns.Shutdown() }()
	cfg := testConfig(t, corpus(t, 40), 1, 1, "colocated")
	cfg.NATS = natsenv.Config{URLs: []string{ns.ClientURL()}, ReconnectWait: 50 * time.Millisecond}
	cfg.AssetCheck = 100 * time.Millisecond
	cfg.StuckAfter = 300 * time.Millisecond
	cfg.LeaseTTL = time.Minute // the service holds its lease through the outage
	var logs syncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r := start(t, cfg)
	if code, body := healthz(t, r.s); code != http.StatusOK {
		t.Fatalf("healthz %d %q before the outage", code, body)
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	checkFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		if code, body := healthz(t, r.s); code != http.StatusServiceUnavailable {
			return errorf("healthz %d %q during the outage; log:\n%s", code, body, logs.String())
		}
		if n := counter(t, r.s, "mmfeed_serve_asset_check_failures_total"); n < 4 {
			return errorf("%v failed asset checks", n)
		}
		if !strings.Contains(logs.String(), "level=ERROR msg=\"jetstream assets unreachable\"") {
			return errorf("no escalation to an error in the log")
		}
		return nil
	})
	if n, lines := counter(t, r.s, "mmfeed_serve_asset_check_failures_total"), strings.Count(logs.String(), "jetstream assets unreachable"); float64(lines) >= n {
		t.Errorf("%d log lines for %v failed checks: want fewer (backoff)", lines, n)
	}
	ns = externalServer(t, port, dir)
	checkFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		if code, body := healthz(t, r.s); code != http.StatusOK {
			return errorf("healthz %d %q after the outage", code, body)
		}
		return nil
	})
}

// TestHealthProblems: what /healthz reports beyond the connection, by state.
func TestHealthProblems(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name    string
		set     func(h *health)
		room    bool
		wantSub string // "" healthy
	}{
		{"idle", func(*health) {}, true, ""},
		{"publishing briefly", func(h *health) { h.pubSince = now.Add(-time.Second) }, true, ""},
		{"publish stuck", func(h *health) { h.pubSince = now.Add(-time.Minute) }, true, "a publish stuck for 1m0s"},
		{"stream full: backpressure", func(h *health) { h.pubSince = now.Add(-time.Minute) }, false, ""},
		{"assets unreachable", func(h *health) { h.checked(errors.New("timeout"), now.Add(-2*time.Second)) }, true,
			"jetstream assets unreachable for 2s: timeout"},
		{"assets back", func(h *health) {
			h.checked(errors.New("timeout"), now.Add(-2*time.Second))
			h.checked(nil, now)
		}, true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var h health
			tc.set(&h)
			got := h.problems(now, 30*time.Second, tc.room)
			if (tc.wantSub == "") != (got == "") || !strings.Contains(got, tc.wantSub) {
				t.Errorf("got %q, want %q", got, tc.wantSub)
			}
		})
	}
}

// TestWatchPublish: a publish in flight past StuckAfter while the stream
// has room is logged (a warning, then an error past twice StuckAfter) and
// ends the service past GiveUpAfter; on a full stream it is backpressure.
func TestWatchPublish(t *testing.T) {
	var logs syncBuffer
	s := &Service{cfg: Config{StuckAfter: time.Second, GiveUpAfter: 5 * time.Second, StreamMaxBytes: 1000},
		log: slog.New(slog.NewTextHandler(&logs, nil))}
	plane := &stubGauges{}
	s.plane = plane
	n := 0
	set := func(ago time.Duration) {
		s.health.mu.Lock()
		s.health.pubSince = time.Now().Add(-ago)
		s.health.mu.Unlock()
	}
	set(500 * time.Millisecond)
	if err := s.watchPublish(&n); err != nil || n != 0 || logs.String() != "" {
		t.Fatalf("a young publish: err %v, n %d, log %q", err, n, logs.String())
	}
	set(1500 * time.Millisecond)
	if err := s.watchPublish(&n); err != nil || n != 1 || !strings.Contains(logs.String(), `level=WARN msg="publish stuck"`) {
		t.Fatalf("stuck: err %v, n %d, log %q", err, n, logs.String())
	}
	set(3 * time.Second)
	_ = s.watchPublish(&n) // n 2: logged (a power of two), as an error now
	if !strings.Contains(logs.String(), `level=ERROR msg="publish stuck"`) {
		t.Errorf("no error after twice StuckAfter: %q", logs.String())
	}
	plane.g.Stream = &deliver.StreamGauges{Bytes: 900}
	if err := s.watchPublish(&n); err != nil || n != 0 {
		t.Errorf("a full stream: err %v, n %d; want backpressure, not stuck", err, n)
	}
	plane.g.Stream = &deliver.StreamGauges{Bytes: 10}
	set(6 * time.Second)
	if err := s.watchPublish(&n); !errors.Is(err, errPublishStuck) {
		t.Errorf("past GiveUpAfter: got %v, want errPublishStuck", err)
	}
}

// TestLostLeaseBucketRecreated deletes the job's lease bucket under a
// running service: the service recreates it, takes its leadership key
// again and keeps serving (without the recreation its renewals fail and it
// stops with ErrLeaseLost after 3/4 of the TTL); the trainers then get every
// batch exactly once.
func TestLostLeaseBucketRecreated(t *testing.T) {
	cfg := testConfig(t, corpus(t, 60), 2, 1, "colocated")
	cfg.Recalibrate = -1
	cfg.QuarantineDir = t.TempDir()
	cfg.AssetCheck = 100 * time.Millisecond
	cfg.LeaseTTL = 2 * time.Second
	var logs syncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r := start(t, cfg)
	_, js := testnats.Connect(t, r.s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := js.DeleteKeyValue(ctx, natsenv.LeaseBucket(cfg.Job)); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		if n := labelled(t, r.s, "mmfeed_serve_assets_recreated_total", "lease"); n < 1 {
			return errorf("lease bucket not recreated")
		}
		return nil
	})
	checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		kv, err := js.KeyValue(ctx, natsenv.LeaseBucket(cfg.Job))
		if err != nil {
			return err
		}
		if _, err := kv.Get(ctx, natsenv.LeaseKey); err != nil {
			return errorf("lease key: %v", err)
		}
		return nil
	})
	// Two TTLs later the service still leads (a lost lease ends Run).
	deadline := time.Now().Add(2 * cfg.LeaseTTL)
	for time.Now().Before(deadline) {
		select {
		case err := <-r.errc:
			t.Fatalf("service ended after its lease bucket was deleted: %v\n%s", err, logs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	trs := runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0})
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	realOnce(t, trs, 0, ex, len(quarantinedIDs(t, cfg.QuarantineDir, 0)))
}

// stubGauges is a data plane that reports g (its other verbs are not
// called).
type stubGauges struct {
	deliver.DataPlane
	g deliver.PlaneGauges
}

func (p *stubGauges) Gauges() deliver.PlaneGauges { return p.g }
