package natsenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mmfeed/mmfeed/internal/ctxutil"
	"github.com/nats-io/nats.go/jetstream"
)

// Lease is the leadership of one job: the key "leader" in a KV bucket whose
// entries expire after the TTL. The holder renews it every TTL/4 with a
// compare-and-set on its last revision; a service that finds the key taken
// stands by and creates it once it has expired (the holder died) or was
// deleted (the holder stopped).
//
// Fencing: a holder that has not renewed for 3/4 of the TTL (an outage)
// is fenced: Check fails with ErrLeaseFenced, and every write to the job's
// state waits in Await (guardedKV) until the lease is held again or the
// write's context ends, so nothing is written under a lease that a standby
// may take once the TTL has passed. When NATS answers again
// the holder takes the lease back if nobody wrote the key since its own last
// revision (the bucket's last sequence is still that revision); a key that
// holds another service's id, or any other write since, is a lost lease
// (ErrLeaseLost) and the service stops so the trainers move to the leader.
// Hold is the only writer of the lease; Check and Await are safe for
// concurrent use.
type Lease struct {
	kv       jetstream.KeyValue
	id       string
	ttl      time.Duration
	log      *slog.Logger
	rev      uint64
	renewed  atomic.Int64 // unix nanoseconds of the last renewal the server confirmed
	released atomic.Bool  // Release ran: no state write passes the fence again
	now      func() time.Time
}

// OpenLease creates or updates the job's lease bucket (LeaseBucket)
// and returns this process's lease of the job under a fresh id (host, pid
// and a random suffix); it holds nothing until Acquire.
func OpenLease(ctx context.Context, js jetstream.JetStream, job string, ttl time.Duration, replicas int, log *slog.Logger) (*Lease, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, leaseBucketConfig(job, ttl, replicas))
	if err != nil {
		return nil, fmt.Errorf("serve: lease bucket %s: %w", LeaseBucket(job), err)
	}
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	id := host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(b[:])
	return &Lease{kv: kv, id: id, ttl: ttl, log: log, now: time.Now}, nil
}

// held records a write of the key the server confirmed at rev.
func (l *Lease) held(rev uint64) {
	l.rev = rev
	l.renewed.Store(l.now().UnixNano())
}

// sinceRenewed is how long ago the server last confirmed the lease.
func (l *Lease) sinceRenewed() time.Duration {
	return l.now().Sub(time.Unix(0, l.renewed.Load()))
}

// Check is nil while this service may write the job's state: it holds the
// lease and renewed it less than 3/4 of the TTL ago (a standby can take the
// lease only after the whole TTL). Safe for concurrent use.
func (l *Lease) Check() error {
	if l.released.Load() {
		return fmt.Errorf("serve: lease released: %w", ErrLeaseLost)
	}
	if d := l.sinceRenewed(); d > 3*l.ttl/4 {
		return fmt.Errorf("serve: lease not renewed for %v (ttl %v): %w", d.Round(time.Millisecond), l.ttl, ErrLeaseFenced)
	}
	return nil
}

// Await waits while the service is fenced (Check fails) until it holds the
// lease again, or ctx ends (Check's ErrLeaseFenced). Safe for
// concurrent use.
func (l *Lease) Await(ctx context.Context) error {
	for {
		err := l.Check()
		if err == nil || l.released.Load() {
			return err // a released lease does not come back: no wait
		}
		if ctxutil.Sleep(ctx, min(l.ttl/8, 100*time.Millisecond)) != nil {
			return err
		}
	}
}

// Acquire waits until this service holds the lease.
func (l *Lease) Acquire(ctx context.Context) error {
	waiting := false
	for {
		rev, err := l.kv.Create(ctx, LeaseKey, []byte(l.id))
		if err == nil {
			l.held(rev)
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
			if e, err := l.kv.Get(ctx, LeaseKey); err == nil {
				holder = string(e.Value())
			}
			l.log.Info("standing by: another service leads the job", "leader", holder, "ttl", l.ttl)
			waiting = true
		}
		if err := ctxutil.Sleep(ctx, l.ttl/8); err != nil {
			return err
		}
	}
}

// Hold renews the lease until ctx ends (nil) or it is lost (ErrLeaseLost).
// A renewal that fails for longer than 3/4 of the TTL fences the service
// (Check fails) instead of ending it: Hold keeps trying, and once NATS
// answers takes the lease back (retake) or reports it lost. giveUp > 0 ends
// a fence that lasts longer (ErrLeaseLost).
func (l *Lease) Hold(ctx context.Context, giveUp time.Duration) error {
	fenced := false
	for {
		if err := ctxutil.Sleep(ctx, l.ttl/4); err != nil {
			return nil
		}
		rctx, cancel := context.WithTimeout(ctx, l.ttl/4)
		rev, err := l.renew(rctx)
		if err != nil && isWrongRevision(err) && l.Check() != nil {
			rev, err = l.retake(rctx) // the key expired while NATS was unreachable
		}
		cancel()
		since := l.sinceRenewed()
		switch {
		case err == nil:
			l.held(rev)
			if fenced {
				l.log.Warn("lease held again after a NATS outage: writing the job's state again", "unrenewed_for", since.Round(time.Millisecond))
				fenced = false
			}
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrLeaseLost):
			return err
		case isWrongRevision(err) && l.reclaim(ctx, since):
		case isWrongRevision(err):
			return fmt.Errorf("serve: another service leads the job now: %w", ErrLeaseLost)
		case giveUp > 0 && since > giveUp:
			return fmt.Errorf("serve: lease not renewed for %v (%v): %w", since.Round(time.Millisecond), err, ErrLeaseLost)
		case since > 3*l.ttl/4 && !fenced:
			fenced = true
			l.log.Error("lease not renewed for 3/4 of its ttl: no writes to the job's state until NATS answers and the lease is held again",
				"unrenewed_for", since.Round(time.Millisecond), "ttl", l.ttl, "err", err)
		case !fenced:
			l.log.Warn("lease renewal failed, retrying", "err", err)
		}
	}
}

// retake creates the key again after a fence, when it expired while NATS
// was unreachable: only if nothing was written to the lease bucket since
// this service's last revision (its last sequence is still l.rev), so no
// other service held the lease in between. Anything else is ErrLeaseLost:
// another holder, or a write whose author is unknown (a renewal applied
// whose answer was lost, then expired: the service stops rather than
// guess; a restart resumes from the durable state).
func (l *Lease) retake(ctx context.Context) (uint64, error) {
	st, err := l.kv.Status(ctx)
	if err != nil {
		return 0, err
	}
	var last uint64
	if js, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		last = js.StreamInfo().State.LastSeq
	}
	if last != l.rev {
		return 0, fmt.Errorf("serve: the lease bucket was written since this service's last renewal (sequence %d, ours %d): %w", last, l.rev, ErrLeaseLost)
	}
	rev, err := l.kv.Create(ctx, LeaseKey, []byte(l.id))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("serve: another service took the lease during the outage: %w", ErrLeaseLost)
	}
	if err == nil && rev != l.rev+1 {
		return 0, fmt.Errorf("serve: the lease was written by another service while it was retaken (revision %d, ours %d): %w", rev, l.rev, ErrLeaseLost)
	}
	return rev, err
}

// renew updates the key at this service's last revision. A wrong revision
// while the key still holds this service's id is this service's own write:
// a renewal the server applied whose answer was lost in an outage, or the
// key as a server killed before it flushed restored it. No standby can hold
// the lease then (it would have written its own id), so renew at the key's
// revision.
func (l *Lease) renew(ctx context.Context) (uint64, error) {
	rev, err := l.kv.Update(ctx, LeaseKey, []byte(l.id), l.rev)
	if err == nil || !isWrongRevision(err) {
		return rev, err
	}
	e, gerr := l.kv.Get(ctx, LeaseKey)
	if gerr != nil || string(e.Value()) != l.id {
		return 0, err
	}
	l.log.Info("lease: renewing at the key's revision (an earlier renewal's answer was lost, or the server restarted)",
		"revision", e.Revision(), "expected", l.rev)
	return l.kv.Update(ctx, LeaseKey, []byte(l.id), e.Revision())
}

// reclaim creates the key again when it vanished while this service held
// it: renewed less than 3/4 of the TTL ago, so it cannot have expired and
// no standby can hold it; its bucket was deleted and recreated empty
// (Assets.EnsureLease, from the service's asset check). True when this
// service holds the lease again.
func (l *Lease) reclaim(ctx context.Context, since time.Duration) bool {
	if since > 3*l.ttl/4 {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, l.ttl/4)
	defer cancel()
	rev, err := l.kv.Create(rctx, LeaseKey, []byte(l.id))
	if err != nil {
		return false
	}
	l.held(rev)
	l.log.Warn("the lease's key vanished with its bucket: took it again", "lease", l.id)
	return true
}

func isWrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		errors.Is(err, jetstream.ErrKeyNotFound)
}

// Release deletes the lease if this service still holds it, so a standby
// takes over at once; from then on every state write is refused (Check), so
// nothing this service still has in flight lands after the standby read the
// state.
func (l *Lease) Release() {
	l.released.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := l.kv.Delete(ctx, LeaseKey, jetstream.LastRevision(l.rev)); err != nil && !isWrongRevision(err) {
		l.log.Warn("lease release", "err", err)
	}
}
