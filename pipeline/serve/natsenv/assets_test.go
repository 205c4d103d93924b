package natsenv

import (
	"context"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go/jetstream"
)

// TestAssetsEnsure creates every asset of a job and reads back what the
// server holds: each asset under its name with the declared settings, and
// a second Ensure with other bounds updates it in place.
func TestAssetsEnsure(t *testing.T) {
	ns := testnats.Server(t, testnats.Options{})
	_, js := testnats.Connect(t, ns.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := Assets{Job: "job-1", Memory: true, Replicas: 1, LeaseTTL: 3 * time.Second, StreamMaxBytes: 1 << 20,
		Duplicates: time.Minute, MaxAckPending: 7, AckWait: 9 * time.Second}
	buckets := map[string]func(context.Context, jetstream.JetStream) (jetstream.KeyValue, error){
		proto.BucketName("job-1"): a.EnsureState, QuarantineBucket("job-1"): a.EnsureQuarantine, LeaseBucket("job-1"): a.EnsureLease,
	}
	for name, ensure := range buckets {
		kv, err := ensure(ctx, js)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Bucket() != name || st.History() != 1 {
			t.Errorf("bucket %s: history %d, want %s with history 1", st.Bucket(), st.History(), name)
		}
		wantTTL := time.Duration(0) // only the lease's entries expire
		if name == LeaseBucket("job-1") {
			wantTTL = a.LeaseTTL
		}
		if st.TTL() != wantTTL {
			t.Errorf("bucket %s: ttl %v, want %v", name, st.TTL(), wantTTL)
		}
	}
	if _, err := a.EnsureStream(ctx, js); err != nil {
		t.Fatal(err)
	}
	a.StreamMaxBytes = 2 << 20 // an update, not a conflict
	s, err := a.EnsureStream(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.Name != proto.StreamName("job-1") || c.MaxBytes != 2<<20 || c.Duplicates != time.Minute ||
		c.Storage != jetstream.MemoryStorage || c.Retention != jetstream.WorkQueuePolicy {
		t.Errorf("stream %+v, want the declared bounds", c)
	}
	c, err := a.EnsureConsumer(ctx, js, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if cc := c.CachedInfo().Config; cc.Durable != proto.ConsumerName("job-1", 1, 0) || cc.MaxAckPending != 7 || cc.AckWait != 9*time.Second {
		t.Errorf("consumer %s: max ack pending %d, ack wait %v, want %s with 7 and 9s", cc.Durable, cc.MaxAckPending, cc.AckWait,
			proto.ConsumerName("job-1", 1, 0))
	}
}
