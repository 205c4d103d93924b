package serve

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A leader that dies (stops renewing, never releases) loses the job to the
// standby within about the TTL, and finds out at its next renewal.
func TestLeaseStandbyTakesOverAfterTTL(t *testing.T) {
	ns := externalServer(t, -1, t.TempDir())
	defer ns.Shutdown()
	js := func() jetstream.JetStream {
		nc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		j, _ := jetstream.New(nc)
		return j
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = time.Second
	a, err := openLease(ctx, js(), "job-1", ttl, 1, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	b, err := openLease(ctx, js(), "job-1", ttl, 1, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	died := time.Now() // a never renews
	if err := b.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	took := time.Since(died)
	t.Logf("standby took over %v after the leader's last renewal (ttl %v)", took, ttl)
	if took < ttl/2 || took > 3*ttl {
		t.Errorf("takeover after %v, want about the TTL %v", took, ttl)
	}
	if err := a.hold(ctx, 0); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("the old leader's hold: %v, want ErrLeaseLost", err)
	}
}

// A renewal the server applied but whose answer was lost (an outage), or a
// server restarted with the key of a moment earlier, leaves the holder's
// revision behind the key's while the key still names the holder: it keeps the
// lease. A service stopped with "another service leads the job" after a 1 s
// NATS restart (test_nats_server_restart_mid_epoch) without this.
func TestLeaseSurvivesALostRenewalAnswer(t *testing.T) {
	ns := externalServer(t, -1, t.TempDir())
	defer ns.Shutdown()
	_, js := testnats.Connect(t, ns.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = time.Second
	a, err := openLease(ctx, js, "job-1", ttl, 1, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	lost, err := a.kv.Update(ctx, leaseKey, []byte(a.id), a.rev) // applied; a never hears of it
	if err != nil {
		t.Fatal(err)
	}
	hctx, stop := context.WithTimeout(ctx, 2*ttl)
	defer stop()
	if err := a.hold(hctx, 0); err != nil {
		t.Fatalf("hold after a lost renewal answer: %v, want to keep the lease", err)
	}
	if a.rev <= lost {
		t.Errorf("lease revision %d, want renewed past %d", a.rev, lost)
	}
	b, err := openLease(ctx, js, "job-1", ttl, 1, testLogger(t)) // another holder's write is still a loss
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.kv.Update(ctx, leaseKey, []byte(b.id), a.rev); err != nil {
		t.Fatal(err)
	}
	if err := a.hold(ctx, 0); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("hold after another service wrote the key: %v, want ErrLeaseLost", err)
	}
}

// A second service for the same job stands by; when the leader stops
// mid-epoch it takes over from the durable state, and the trainers, who keep
// their connections, get every batch exactly once in plan order.
func TestStandbyServiceContinuesThePlan(t *testing.T) {
	ns := externalServer(t, -1, t.TempDir())
	defer ns.Shutdown()
	cfg := testConfig(t, corpus(t, 120), 2, 1, "colocated")
	cfg.Recalibrate, cfg.LeaseTTL = -1, time.Second
	cfg.QuarantineDir = t.TempDir()
	cfg.NATS = natsenv.Config{URLs: []string{ns.ClientURL()}, ReconnectWait: 50 * time.Millisecond}
	cfg.StreamMaxBytes = 256 << 10 // a few steps ahead, so the takeover happens mid-epoch
	leader := start(t, cfg)
	standbyCfg := cfg
	standbyCfg.QuarantineDir = t.TempDir()
	standby, err := New(standbyCfg)
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	serr := make(chan error, 1)
	go func() { serr <- standby.Run(sctx) }()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
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
	checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := counter(t, leader.s, "mmfeed_serve_batches_total"); n < 8 {
			return errorf("%v batches published", n)
		}
		return nil
	})
	select {
	case <-standby.Ready():
		t.Fatal("the standby started serving while the leader held the job")
	default:
	}
	if err := leader.stop(t); err != nil {
		t.Fatalf("leader: %v", err)
	}
	stopped := time.Now()
	select {
	case <-standby.Ready():
		t.Logf("standby serving %v after the leader stopped", time.Since(stopped))
	case <-time.After(20 * time.Second):
		t.Fatal("the standby did not take over")
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("trainer %d: %v", i, err)
		}
	}
	select {
	case err := <-serr:
		if err != nil {
			t.Fatalf("standby: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the standby did not finish")
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	realOnce(t, trs, 0, ex, len(quarantinedIDs(t, cfg.QuarantineDir, 0)))
}

// A holder that has not renewed its lease for 3/4 of the TTL is fenced:
// every write to the job's state is refused (ErrLeaseFenced) and nothing
// reaches the bucket, so a standby that takes the lease once the TTL has
// passed never sees a write of the old holder's.
func TestFencedLeaseRefusesStateWrites(t *testing.T) {
	ns := externalServer(t, -1, t.TempDir())
	defer ns.Shutdown()
	_, js := testnats.Connect(t, ns.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = 2 * time.Second
	l, err := openLease(ctx, js, "job-1", ttl, 1, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	kv, err := proto.EnsureKV(ctx, js, "job-1", true, 1)
	if err != nil {
		t.Fatal(err)
	}
	st := state{guardedKV{KeyValue: kv, fence: l.await}}
	if err := st.putInt(ctx, "k", 1); err != nil {
		t.Fatalf("write under a held lease: %v", err)
	}
	later := time.Now().Add(ttl)
	l.now = func() time.Time { return later } // no renewal for a whole TTL
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer wcancel()
	writes := map[string]func() error{
		"put":    func() error { return st.putInt(wctx, "k", 2) },
		"json":   func() error { return st.putJSON(wctx, "j", 2) },
		"delete": func() error { return st.delete(wctx, "k") },
		"rank":   func() error { return proto.PutRankStep(wctx, st.kv, 0, 0, 0, 3) },
	}
	for name, w := range writes {
		if err := w(); !errors.Is(err, ErrLeaseFenced) {
			t.Errorf("%s while fenced: %v, want ErrLeaseFenced once its context ends", name, err)
		}
	}
	if v, ok, err := st.getInt(ctx, "k"); err != nil || !ok || v != 1 {
		t.Errorf("k after the fenced writes: %d %v %v, want 1", v, ok, err)
	}
	if _, _, ok, err := proto.GetRankStep(ctx, kv, 0, 0); err != nil || ok {
		t.Errorf("rank step after a fenced write: %v %v, want none", ok, err)
	}
	done := make(chan error, 1)
	go func() { done <- st.putInt(ctx, "k", 3) }() // waits for the lease
	time.Sleep(100 * time.Millisecond)
	l.now = time.Now
	l.held(l.rev)
	if err := <-done; err != nil {
		t.Fatalf("a fenced write once the lease is held again: %v", err)
	}
	if v, _, _ := st.getInt(ctx, "k"); v != 3 {
		t.Errorf("k = %d after the lease came back, want 3", v)
	}
}

// An idempotent state write whose request is lost (no answer: the server's
// JetStream not up yet after a reconnect) is sent again after kvAttempt
// instead of waiting out its caller's deadline: after a 3 s outage a
// position write lost this way held the next step back for 7 s.
func TestStateWriteAskedAgainAfterALostRequest(t *testing.T) {
	old := kvAttempt
	kvAttempt = 50 * time.Millisecond
	t.Cleanup(func() { kvAttempt = old })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	calls := 0
	err := again(ctx, func(actx context.Context) error {
		if calls++; calls < 3 {
			<-actx.Done() // lost: never answered
			return actx.Err()
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("again: %v after %d attempts, want success at the 3rd", err, calls)
	}
	if ctx.Err() != nil {
		t.Fatal("the caller's deadline ran out")
	}
	wantErr := errors.New("wrong last sequence")
	calls = 0
	if err := again(ctx, func(context.Context) error { calls++; return wantErr }); err != wantErr || calls != 1 {
		t.Errorf("an answered failure: %v after %d attempts, want it at once", err, calls)
	}
}

// A write whose caller set no deadline gets one attempt, as before again.
func TestStateWriteWithoutADeadlineIsOneAttempt(t *testing.T) {
	calls := 0
	if err := again(context.Background(), func(context.Context) error { calls++; return fmt.Errorf("%w", context.DeadlineExceeded) }); !errors.Is(err, context.DeadlineExceeded) || calls != 1 {
		t.Errorf("no deadline: %v after %d attempts, want one", err, calls)
	}
}
