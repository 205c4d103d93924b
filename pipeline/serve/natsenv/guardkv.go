package natsenv

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// guardedKV is the job's state bucket as the service writes it (Guard).
// Every write first passes fence (the lease's Await: nothing is written
// under a lease the service may no longer hold; a fenced write waits for
// the lease or its context) and then reports its outcome to stored, which
// for the service names a storage cause (a full disk, StorageCause) and
// keeps /healthz's state; Put and Delete are sent again in attempts of
// kvAttempt (again); reads pass through. Safe for concurrent use.
type guardedKV struct {
	jetstream.KeyValue
	fence  func(context.Context) error
	stored func(error) error
}

// Guard returns kv as the service writes it: every write waits for fence
// (nil: none) first, and its outcome goes through stored (nil: unchanged).
func Guard(kv jetstream.KeyValue, fence func(context.Context) error, stored func(error) error) jetstream.KeyValue {
	return guardedKV{KeyValue: kv, fence: fence, stored: stored}
}

func (g guardedKV) write(ctx context.Context, do func() error) error {
	if g.fence != nil {
		if err := g.fence(ctx); err != nil {
			return err
		}
	}
	if g.stored == nil {
		return do()
	}
	return g.stored(do())
}

func (g guardedKV) Put(ctx context.Context, key string, value []byte) (rev uint64, err error) {
	err = g.write(ctx, func() error {
		return again(ctx, func(actx context.Context) (err error) { rev, err = g.KeyValue.Put(actx, key, value); return })
	})
	return rev, err
}

func (g guardedKV) PutString(ctx context.Context, key, value string) (uint64, error) {
	return g.Put(ctx, key, []byte(value))
}

func (g guardedKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (rev uint64, err error) {
	err = g.write(ctx, func() (err error) { rev, err = g.KeyValue.Create(ctx, key, value, opts...); return })
	return rev, err
}

func (g guardedKV) Update(ctx context.Context, key string, value []byte, last uint64) (rev uint64, err error) {
	err = g.write(ctx, func() (err error) { rev, err = g.KeyValue.Update(ctx, key, value, last); return })
	return rev, err
}

func (g guardedKV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	return g.write(ctx, func() error {
		return again(ctx, func(actx context.Context) error { return g.KeyValue.Delete(actx, key, opts...) })
	})
}

// kvAttempt bounds one attempt of an idempotent state write (a Put, a
// Delete): a request lost as the connection comes back from an outage (the
// server's JetStream not answering yet) is sent again after this instead of
// waiting out the caller's whole deadline.
var kvAttempt = 2 * time.Second

// again runs an idempotent write in attempts of at most kvAttempt until one
// is answered or ctx ends; the last attempt's error is returned. A ctx
// without a deadline gets one attempt (JetStream's own default timeout), as
// before: again never turns a bounded write into an unbounded one.
func again(ctx context.Context, do func(context.Context) error) error {
	if _, ok := ctx.Deadline(); !ok {
		return do(ctx)
	}
	for {
		actx, cancel := context.WithTimeout(ctx, kvAttempt)
		err := do(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			return err
		}
	}
}

func (g guardedKV) Purge(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	return g.write(ctx, func() error { return g.KeyValue.Purge(ctx, key, opts...) })
}

func (g guardedKV) PurgeDeletes(ctx context.Context, opts ...jetstream.KVPurgeOpt) error {
	return g.write(ctx, func() error { return g.KeyValue.PurgeDeletes(ctx, opts...) })
}

// minFreeBytes is the free space below which a failed state write is
// blamed on a full disk: less than one of the file store's blocks.
const minFreeBytes = 4 << 20

// StorageCause returns err with its storage cause named when the embedded
// server ns's data directory dir is full (ErrStorageFull, with the bytes
// free) or the server's JetStream turned itself off (nats-server does so
// after a write fails with ENOSPC); err unchanged otherwise, and for an
// answer about a key (IsKeyAnswer). With an external server (ns nil) the
// service cannot see its disk and StorageCause returns err.
func StorageCause(ns *server.Server, dir string, err error) error {
	if err == nil || errors.Is(err, ErrStorageFull) || ns == nil || IsKeyAnswer(err) {
		return err
	}
	if free, ok := freeBytes(dir); ok && free < minFreeBytes {
		return fmt.Errorf("serve: no space left on device (ENOSPC): data dir %s has %d bytes free: %w (%w)", dir, free, ErrStorageFull, err)
	}
	if !ns.JetStreamEnabled() {
		return fmt.Errorf("serve: the embedded server turned JetStream off (it does after a write fails, e.g. no space left in %s; restart once there is room): %w (%w)",
			dir, ErrStorageFull, err)
	}
	return err
}

// freeBytes is the space available to unprivileged writers on dir's file
// system.
func freeBytes(dir string) (uint64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return uint64(st.Bavail) * uint64(st.Bsize), true
}

// IsKeyAnswer reports whether err is JetStream's answer about a key (it
// exists, it is not there, its revision is not the one expected): not a
// failed write.
func IsKeyAnswer(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || isWrongRevision(err)
}
