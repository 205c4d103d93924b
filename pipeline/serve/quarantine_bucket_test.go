package serve

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Every quarantined sample has exactly one record in the job's quarantine
// bucket, keyed by its id, though both epochs quarantine it.
func TestQuarantineBucketOneRecordPerSample(t *testing.T) {
	cfg := testConfig(t, corpus(t, 120), 2, 1, "colocated")
	cfg.Epochs, cfg.Recalibrate = 2, -1
	cfg.QuarantineDir = t.TempDir()
	r := start(t, cfg)
	tctx, tcancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer tcancel()
	// The trainers take epoch 0 only: the service then waits for epoch 1's
	// (had they taken both, it would end the job and shut its embedded
	// server down while the bucket is read). Epoch 1 is planned meanwhile,
	// which records its quarantine.
	runTrainersConn(t, tctx, cfg, r.s.ClientURL(), []int{0}, false)
	checkFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		if _, ok := r.s.epochs.Info(1); !ok {
			return errorf("epoch 1 not planned")
		}
		return nil
	})
	// The bucket is read with its own deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := nats.Connect(r.s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, QuarantineBucket(cfg.Job))
	if err != nil {
		t.Fatal(err)
	}
	want := quarantinedIDs(t, cfg.QuarantineDir, 0)
	if len(want) == 0 {
		t.Fatal("the corpus quarantined nothing: the test would check nothing")
	}
	for id := range quarantinedIDs(t, cfg.QuarantineDir, 1) {
		if !want[id] {
			t.Fatalf("epoch 1 quarantined %q, epoch 0 did not", id)
		}
	}
	keys, err := kv.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != len(want) {
		t.Errorf("%d records in the bucket, want one per quarantined sample: %d", len(keys), len(want))
	}
	for id := range want {
		e, err := kv.Get(ctx, work.QuarantineKey(id, ""))
		if err != nil {
			t.Errorf("no record of %q: %v", id, err)
			continue
		}
		var rec struct{ ID, Reason string }
		if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.ID != id || rec.Reason == "" {
			t.Errorf("record of %q: %s (%v)", id, e.Value(), err)
		}
	}
}
