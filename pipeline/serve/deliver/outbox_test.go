package deliver

import (
	"context"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

func outKey(step, mb int) proto.BatchKey {
	return proto.BatchKey{Job: "j", Step: step, MicroBatch: mb}
}

// put waits while the outbox is over its bound, unless the rank has nothing
// its trainer has not fetched, or a fetch waits for the batch or a later one:
// a waiting trainer always gets its next batch, also when the outbox holds
// batches it will never fetch (a standby rebuilt them after a takeover).
func TestOutboxBound(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fetched bool            // rank 0's held batch was fetched
		want    *proto.BatchKey // a fetch of rank 0 waits for this batch
		admit   bool
	}{
		{"unfetched batch held: wait", false, nil, false},
		{"everything held was fetched: admit", true, nil, true},
		{"unfetched batch held, a fetch waits for this one: admit", false, &proto.BatchKey{Job: "j", Step: 1}, true},
		{"unfetched batch held, a fetch waits for a later one: admit", false, &proto.BatchKey{Job: "j", Step: 2, MicroBatch: 1}, true},
		{"unfetched batch held, a fetch waits for an earlier one: wait", false, &proto.BatchKey{Job: "j", Step: 0, MicroBatch: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOutbox(2, 100)
			ctx := context.Background()
			if err := o.Put(ctx, 0, NewItem(outKey(0, 0), 0, make([]byte, 80))); err != nil {
				t.Fatal(err)
			}
			if tc.fetched {
				if it, _ := o.Lookup(0, outKey(0, 0)); it == nil {
					t.Fatal("held batch not found")
				}
			}
			if tc.want != nil {
				defer o.Want(0, *tc.want)()
			}
			wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			err := o.Put(wctx, 0, NewItem(outKey(1, 0), 0, make([]byte, 80)))
			if got := err == nil; got != tc.admit {
				t.Fatalf("admitted = %v (%v), want %v", got, err, tc.admit)
			}
		})
	}
}

func TestOutboxAckAndPurge(t *testing.T) {
	o := NewOutbox(1, 1<<20)
	ctx := context.Background()
	for step := range 3 {
		for mb := range 2 {
			if err := o.Put(ctx, 0, NewItem(outKey(step, mb), 0, make([]byte, 10))); err != nil {
				t.Fatal(err)
			}
		}
	}
	o.Ack(0, outKey(1, 0))
	if k, ok := o.First(0); !ok || k != outKey(1, 1) {
		t.Errorf("after ack of s1/mb0 first = %v %v, want s1/mb1", k, ok)
	}
	if got := o.Size(); got != 30 {
		t.Errorf("size = %d, want 30", got)
	}
	o.Ack(0, outKey(0, 1)) // an older ack drops nothing more
	if got := o.Size(); got != 30 {
		t.Errorf("size after an old ack = %d, want 30", got)
	}
	o.Purge(0)
	if _, ok := o.First(0); ok || o.Size() != 0 {
		t.Errorf("after purge: size %d", o.Size())
	}
}

// TestOutboxWakesOnlyTheRanksFetches: a fetch waiting for a batch of rank 0
// is woken by a change of rank 0's batches (a put, an ack, a purge), not by
// another rank's: at 1,024 ranks a shared wake-up made every step's
// thousands of changes wake thousands of waiting fetches.
func TestOutboxWakesOnlyTheRanksFetches(t *testing.T) {
	key := func(step int) proto.BatchKey { return proto.BatchKey{Job: "j", Step: step} }
	item := func(step int) *Item { return NewItem(key(step), 0, []byte{1}) }
	for _, tt := range []struct {
		name   string
		change func(o *Outbox)
		wake   bool
	}{
		{"put of another rank", func(o *Outbox) { _ = o.Put(context.Background(), 1, item(0)) }, false},
		{"ack of another rank", func(o *Outbox) { o.Ack(1, key(0)) }, false},
		{"purge of another rank", func(o *Outbox) { o.Purge(1) }, false},
		{"put of its rank", func(o *Outbox) { _ = o.Put(context.Background(), 0, item(1)) }, true},
		{"ack of its rank", func(o *Outbox) { o.Ack(0, key(0)) }, true},
		{"purge of its rank", func(o *Outbox) { o.Purge(0) }, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := NewOutbox(2, 1<<20)
			for r := range 2 {
				if err := o.Put(context.Background(), r, item(0)); err != nil {
					t.Fatal(err)
				}
			}
			it, ch := o.Lookup(0, key(5))
			if it != nil || ch == nil {
				t.Fatalf("lookup of a batch not held: %v, %v", it, ch)
			}
			tt.change(o)
			if got := closed(ch); got != tt.wake {
				t.Errorf("woken %v, want %v", got, tt.wake)
			}
		})
	}
}

// closed reports whether ch is closed (or holds a value), without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
