package deliver

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// sendLog is FetchParts that records the batches sent and the hands that
// failed.
type sendLog struct {
	replies []string
	sent    []proto.BatchKey
	failed  []error
}

func (l *sendLog) Send(reply string, it *Item) {
	l.replies = append(l.replies, reply)
	l.sent = append(l.sent, it.Key())
}

func (l *sendLog) HandFailed(_ int, err error) { l.failed = append(l.failed, err) }

// refusingStore is a bucket that refuses every write (a fenced lease).
type refusingStore struct{ *memStore }

var errRefused = errors.New("write refused")

func (refusingStore) PutJSON(context.Context, string, any) error { return errRefused }
func (refusingStore) PutInt(context.Context, string, int) error  { return errRefused }

// TestAnswerSendsAHeldBatchOnceHanded: a held batch goes to the newest
// fetch's inbox once the rank table recorded it as handed; when that record
// cannot be written the batch is not sent.
func TestAnswerSendsAHeldBatchOnceHanded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key := proto.BatchKey{Step: 0, MicroBatch: 0}
	for _, refuse := range []bool{false, true} {
		var st Store = newMemStore()
		if refuse {
			st = refusingStore{newMemStore()}
		}
		tab := NewRanks(1, 1, nil, st)
		out := NewOutbox(1, 1<<20)
		if err := out.Put(ctx, 0, NewItem(key, 0, []byte("batch"))); err != nil {
			t.Fatal(err)
		}
		parts := &sendLog{}
		f := NewFetches(out, tab, NewPublisher(), parts)
		waits := NewFetchWaits()
		w := waits.Join(key, "inbox.1", time.Now())
		f.Answer(ctx, 0, key, waits, w)
		_, handed := tab.Get(0).Handed()
		switch {
		case !refuse && (len(parts.sent) != 1 || parts.replies[0] != "inbox.1" || !handed || len(parts.failed) > 0):
			t.Errorf("held batch: sent %v to %v, handed %v, failures %v; want it sent to inbox.1 and handed", parts.sent, parts.replies, handed, parts.failed)
		case refuse && (len(parts.sent) > 0 || handed || len(parts.failed) != 1 || !errors.Is(parts.failed[0], errRefused)):
			t.Errorf("handed record refused: sent %v, handed %v, failures %v; want nothing sent and the failure reported", parts.sent, handed, parts.failed)
		}
	}
}

// TestAnswerRewindsADroppedBatch: a fetch of a batch that was built (the
// rank's cursor is past its step) and is no longer held asks the publisher
// for a rewind of the rank to the batch's step, then sends the batch once
// it is held again.
func TestAnswerRewindsADroppedBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tab := NewRanks(1, 1, nil, newMemStore())
	tab.Set(0, tab.Get(0).WithCursor(proto.Pos{Step: 3}))
	out := NewOutbox(1, 1<<20)
	p := NewPublisher()
	parts := &sendLog{}
	f := NewFetches(out, tab, p, parts)
	key := proto.BatchKey{Step: 1, MicroBatch: 0}
	waits := NewFetchWaits()
	w := waits.Join(key, "inbox.1", time.Now())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Answer(ctx, 0, key, waits, w)
	}()
	select {
	case req := <-p.Rewinds():
		if req.Rank != 0 || req.To != (proto.Pos{Step: 1}) {
			t.Errorf("rewind %+v, want rank 0 to step 1", req)
		}
	case <-ctx.Done():
		t.Fatal("no rewind asked for a dropped batch")
	}
	if err := out.Put(ctx, 0, NewItem(key, 1, []byte("again"))); err != nil {
		t.Fatal(err)
	}
	<-done
	if len(parts.sent) != 1 || parts.sent[0] != key {
		t.Errorf("sent %v after the batch was built again, want %v", parts.sent, key)
	}
}
