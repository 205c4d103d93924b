package serve

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
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
	kv := kvStore{&state{kv: failingKV{}}}
	tab := deliver.NewRanks(1, 1, epochs.NewBook(nil, nil), kv)
	key := proto.BatchKey{Epoch: 0, Step: 0, MicroBatch: 0}
	if err := tab.Hand(context.Background(), 0, key); !errors.Is(err, errWriteFailed) {
		t.Fatalf("hand with a failing KV: %v, want the write's error", err)
	}
	handed, any := tab.Get(0).Handed()
	recorded, recOK := tab.Get(0).Recorded()
	if any || recOK {
		t.Errorf("after a failed record: handed %v (any %v), recorded %v (ok %v), want nothing", handed, any, recorded, recOK)
	}
	ok := deliver.NewRanks(1, 1, epochs.NewBook(nil, nil), nil) // no bucket: memory only
	if err := ok.Hand(context.Background(), 0, key); err != nil {
		t.Fatal(err)
	}
	if handed, any := ok.Get(0).Handed(); !any || handed != key {
		t.Errorf("without a bucket: handed %v (any %v), want %v", handed, any, key)
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
