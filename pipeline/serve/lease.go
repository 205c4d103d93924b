package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go/jetstream"
)

// leaseKey is the leader's key in the lease bucket.
const leaseKey = "leader"

// LeaseBucket returns the KV bucket of a job's leadership lease:
// mmfeed_<job>_lease, whose age limit is the lease TTL.
func LeaseBucket(job string) string { return proto.BucketName(job) + "_lease" }

// lease is the leadership of one job: the key "leader" in a KV bucket whose
// entries expire after the TTL. The holder renews it every TTL/4 with a
// compare-and-set on its last revision; a service that finds the key taken
// stands by and creates it once it has expired (the holder died) or was
// deleted (the holder stopped). A holder that cannot renew for 3/4 of the
// TTL, or finds another holder, stops serving (ErrLeaseLost), before a
// standby can take over. Not safe for concurrent use.
type lease struct {
	kv  jetstream.KeyValue
	id  string
	ttl time.Duration
	log *slog.Logger
	rev uint64
}

func openLease(ctx context.Context, js jetstream.JetStream, job string, ttl time.Duration, replicas int, log *slog.Logger) (*lease, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, leaseKVConfig(job, ttl, replicas))
	if err != nil {
		return nil, fmt.Errorf("serve: lease bucket %s: %w", LeaseBucket(job), err)
	}
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	id := host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(b[:])
	return &lease{kv: kv, id: id, ttl: ttl, log: log}, nil
}

// acquire waits until this service holds the lease.
func (l *lease) acquire(ctx context.Context) error {
	waiting := false
	for {
		rev, err := l.kv.Create(ctx, leaseKey, []byte(l.id))
		if err == nil {
			l.rev = rev
			if waiting {
				l.log.Info("took over the job", "lease", l.id)
			}
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && ctx.Err() == nil {
			l.log.Warn("lease", "err", err)
		}
		if !waiting {
			holder := "?"
			if e, err := l.kv.Get(ctx, leaseKey); err == nil {
				holder = string(e.Value())
			}
			l.log.Info("standing by: another service leads the job", "leader", holder, "ttl", l.ttl)
			waiting = true
		}
		if err := sleepCtx(ctx, l.ttl/8); err != nil {
			return err
		}
	}
}

// hold renews the lease until ctx ends (nil) or it is lost (ErrLeaseLost).
func (l *lease) hold(ctx context.Context) error {
	renewed := time.Now()
	for {
		if err := sleepCtx(ctx, l.ttl/4); err != nil {
			return nil
		}
		rctx, cancel := context.WithTimeout(ctx, l.ttl/4)
		rev, err := l.renew(rctx)
		cancel()
		switch {
		case err == nil:
			l.rev, renewed = rev, time.Now()
		case ctx.Err() != nil:
			return nil
		case isWrongRevision(err) && l.reclaim(ctx, renewed):
			renewed = time.Now()
		case isWrongRevision(err):
			return fmt.Errorf("serve: another service leads the job now: %w", ErrLeaseLost)
		case time.Since(renewed) > 3*l.ttl/4:
			return fmt.Errorf("serve: lease not renewed for %v (%v): %w", time.Since(renewed).Round(time.Millisecond), err, ErrLeaseLost)
		default:
			l.log.Warn("lease renewal failed, retrying", "err", err)
		}
	}
}

// renew updates the key at this service's last revision. A wrong revision
// while the key still holds this service's id is this service's own write:
// a renewal the server applied whose answer was lost in an outage, or the
// key as a server killed before it flushed restored it. No standby can hold
// the lease then (it would have written its own id), so renew at the key's
// revision.
func (l *lease) renew(ctx context.Context) (uint64, error) {
	rev, err := l.kv.Update(ctx, leaseKey, []byte(l.id), l.rev)
	if err == nil || !isWrongRevision(err) {
		return rev, err
	}
	e, gerr := l.kv.Get(ctx, leaseKey)
	if gerr != nil || string(e.Value()) != l.id {
		return 0, err
	}
	l.log.Info("lease: renewing at the key's revision (an earlier renewal's answer was lost, or the server restarted)",
		"revision", e.Revision(), "expected", l.rev)
	return l.kv.Update(ctx, leaseKey, []byte(l.id), e.Revision())
}

// reclaim creates the key again when it vanished while this service held
// it: renewed less than 3/4 of the TTL ago, so it cannot have expired and
// no standby can hold it; its bucket was deleted and recreated empty
// (checkAssets). True when this service holds the lease again.
func (l *lease) reclaim(ctx context.Context, renewed time.Time) bool {
	if time.Since(renewed) > 3*l.ttl/4 {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, l.ttl/4)
	defer cancel()
	rev, err := l.kv.Create(rctx, leaseKey, []byte(l.id))
	if err != nil {
		return false
	}
	l.rev = rev
	l.log.Warn("the lease's key vanished with its bucket: took it again", "lease", l.id)
	return true
}

func isWrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		errors.Is(err, jetstream.ErrKeyNotFound)
}

// release deletes the lease if this service still holds it, so a standby
// takes over at once.
func (l *lease) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := l.kv.Delete(ctx, leaseKey, jetstream.LastRevision(l.rev)); err != nil && !isWrongRevision(err) {
		l.log.Warn("lease release", "err", err)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
