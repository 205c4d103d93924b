package natsenv

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A leader that dies (stops renewing, never releases) loses the job to the
// standby within about the TTL, and finds out at its next renewal.
func TestLeaseStandbyTakesOverAfterTTL(t *testing.T) {
	ns := testnats.Server(t, testnats.Options{})
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
	a, err := OpenLease(ctx, js(), "job-1", ttl, 1, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenLease(ctx, js(), "job-1", ttl, 1, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	died := time.Now() // a never renews
	if err := b.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	took := time.Since(died)
	t.Logf("standby took over %v after the leader's last renewal (ttl %v)", took, ttl)
	if took < ttl/2 || took > 3*ttl {
		t.Errorf("takeover after %v, want about the TTL %v", took, ttl)
	}
	if err := a.Hold(ctx, 0); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("the old leader's hold: %v, want ErrLeaseLost", err)
	}
}

// A renewal the server applied but whose answer was lost (an outage), or a
// server restarted with the key of a moment earlier, leaves the holder's
// revision behind the key's while the key still names the holder: it keeps the
// lease. A service stopped with "another service leads the job" after a 1 s
// NATS restart (test_nats_server_restart_mid_epoch) without this.
func TestLeaseSurvivesALostRenewalAnswer(t *testing.T) {
	ns := testnats.Server(t, testnats.Options{})
	defer ns.Shutdown()
	_, js := testnats.Connect(t, ns.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = time.Second
	a, err := OpenLease(ctx, js, "job-1", ttl, 1, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	lost, err := a.kv.Update(ctx, LeaseKey, []byte(a.id), a.rev) // applied; a never hears of it
	if err != nil {
		t.Fatal(err)
	}
	hctx, stop := context.WithTimeout(ctx, 2*ttl)
	defer stop()
	if err := a.Hold(hctx, 0); err != nil {
		t.Fatalf("hold after a lost renewal answer: %v, want to keep the lease", err)
	}
	if a.rev <= lost {
		t.Errorf("lease revision %d, want renewed past %d", a.rev, lost)
	}
	b, err := OpenLease(ctx, js, "job-1", ttl, 1, testnats.Logger(t)) // another holder's write is still a loss
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.kv.Update(ctx, LeaseKey, []byte(b.id), a.rev); err != nil {
		t.Fatal(err)
	}
	if err := a.Hold(ctx, 0); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("hold after another service wrote the key: %v, want ErrLeaseLost", err)
	}
}

// TestReleasedLeaseRefusesWrites: once the service released its lease (a
// standby may hold it and read the state any moment), the fence refuses
// every state write at once, instead of letting a handler still running
// write, or wait, after the handoff.
func TestReleasedLeaseRefusesWrites(t *testing.T) {
	ns := testnats.Server(t, testnats.Options{})
	defer ns.Shutdown()
	_, js := testnats.Connect(t, ns.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := OpenLease(ctx, js, "job-1", time.Minute, 1, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Await(ctx); err != nil {
		t.Fatalf("held lease: %v", err)
	}
	l.Release()
	t0 := time.Now()
	if err := l.Await(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("released lease: await %v, want ErrLeaseLost", err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("await of a released lease took %v, want at once", d)
	}
}

// A holder that has not renewed its lease for 3/4 of the TTL is fenced:
// every write to the job's state is refused (ErrLeaseFenced) and nothing
// reaches the bucket, so a standby that takes the lease once the TTL has
// passed never sees a write of the old holder's.
func TestFencedLeaseRefusesStateWrites(t *testing.T) {
	ns := testnats.Server(t, testnats.Options{})
	defer ns.Shutdown()
	_, js := testnats.Connect(t, ns.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = 2 * time.Second
	l, err := OpenLease(ctx, js, "job-1", ttl, 1, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	kv, err := proto.EnsureKV(ctx, js, "job-1", true, 1)
	if err != nil {
		t.Fatal(err)
	}
	g := Guard(kv, l.Await, nil)
	value := func(key string) string {
		e, err := kv.Get(ctx, key)
		if err != nil {
			return err.Error()
		}
		return string(e.Value())
	}
	if _, err := g.Put(ctx, "k", []byte("1")); err != nil {
		t.Fatalf("write under a held lease: %v", err)
	}
	var skew atomic.Int64 // how far the lease's clock is ahead; read by the fenced writes' Await
	l.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	skew.Store(int64(ttl)) // no renewal for a whole TTL
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer wcancel()
	writes := map[string]func() error{
		"put":    func() error { _, err := g.Put(wctx, "k", []byte("2")); return err },
		"create": func() error { _, err := g.Create(wctx, "j", []byte("2")); return err },
		"update": func() error { _, err := g.Update(wctx, "k", []byte("2"), 1); return err },
		"delete": func() error { return g.Delete(wctx, "k") },
		"rank":   func() error { return proto.PutRankStep(wctx, g, 0, 0, 0, 3) },
	}
	for name, w := range writes {
		if err := w(); !errors.Is(err, ErrLeaseFenced) {
			t.Errorf("%s while fenced: %v, want ErrLeaseFenced once its context ends", name, err)
		}
	}
	if v := value("k"); v != "1" {
		t.Errorf("k after the fenced writes: %s, want 1", v)
	}
	if _, err := kv.Get(ctx, "j"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("j after a fenced create: %v, want none", err)
	}
	if _, _, ok, err := proto.GetRankStep(ctx, kv, 0, 0); err != nil || ok {
		t.Errorf("rank step after a fenced write: %v %v, want none", ok, err)
	}
	done := make(chan error, 1)
	go func() { _, err := g.Put(ctx, "k", []byte("3")); done <- err }() // waits for the lease
	time.Sleep(100 * time.Millisecond)
	skew.Store(0)
	l.held(l.rev)
	if err := <-done; err != nil {
		t.Fatalf("a fenced write once the lease is held again: %v", err)
	}
	if v := value("k"); v != "3" {
		t.Errorf("k = %s after the lease came back, want 3", v)
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
