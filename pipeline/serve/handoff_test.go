package serve

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go/jetstream"
)

// failingKV is a KV bucket whose writes fail (a full disk, a fenced lease).
type failingKV struct{ jetstream.KeyValue }

var errWriteFailed = errors.New("write failed")

func (failingKV) Put(context.Context, string, []byte) (uint64, error) { return 0, errWriteFailed }

// TestHandWithoutRecordMovesNothing: when the handed record cannot be
// written, hand fails and the rank's handed batch does not move, so the
// batch is not sent and an ack of it is refused. Before, the memory moved
// and the batch went out anyway: after a failover the next service, which
// never saw the record, refused the rank's ack of it forever
// (TestStandbyPlannerWithWorkers hung on a fast machine).
func TestHandWithoutRecordMovesNothing(t *testing.T) {
	kv := &state{kv: failingKV{}}
	tab := newRankTable(1, 1, epochs.NewBook(nil, nil), kv)
	key := proto.BatchKey{Epoch: 0, Step: 0, MicroBatch: 0}
	if err := tab.hand(context.Background(), 0, key); !errors.Is(err, errWriteFailed) {
		t.Fatalf("hand with a failing KV: %v, want the write's error", err)
	}
	if rs := tab.get(0); rs.anyHanded || rs.recOK {
		t.Errorf("after a failed record: handed %v (any %v), recorded %v (ok %v), want nothing", rs.handed, rs.anyHanded, rs.recorded, rs.recOK)
	}
	ok := newRankTable(1, 1, epochs.NewBook(nil, nil), nil) // no bucket: memory only
	if err := ok.hand(context.Background(), 0, key); err != nil {
		t.Fatal(err)
	}
	if rs := ok.get(0); !rs.anyHanded || rs.handed != key {
		t.Errorf("without a bucket: handed %v (any %v), want %v", rs.handed, rs.anyHanded, key)
	}
}

// TestReleasedLeaseRefusesWrites: once the service released its lease (a
// standby may hold it and read the state any moment), the fence refuses
// every state write at once, instead of letting a handler still running
// write, or wait, after the handoff.
func TestReleasedLeaseRefusesWrites(t *testing.T) {
	ns := externalServer(t, -1, t.TempDir())
	defer ns.Shutdown()
	_, js := testnats.Connect(t, ns.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := openLease(ctx, js, "job-1", time.Minute, 1, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.await(ctx); err != nil {
		t.Fatalf("held lease: %v", err)
	}
	l.release()
	t0 := time.Now()
	if err := l.await(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("released lease: await %v, want ErrLeaseLost", err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("await of a released lease took %v, want at once", d)
	}
}
