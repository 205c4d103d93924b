package work

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// electingStore is an object store whose stream has no leader for its
// first reads: they get no responders, as on a cluster that just started.
type electingStore struct {
	jetstream.ObjectStore
	unanswered int
	puts       int
}

func (s *electingStore) GetInfo(context.Context, string, ...jetstream.GetObjectInfoOpt) (*jetstream.ObjectInfo, error) {
	if s.unanswered > 0 {
		s.unanswered--
		return nil, nats.ErrNoResponders
	}
	return nil, jetstream.ErrObjectNotFound
}

func (s *electingStore) PutBytes(context.Context, string, []byte) (*jetstream.ObjectInfo, error) {
	s.puts++
	return &jetstream.ObjectInfo{}, nil
}

// TestPutObjectWaitsForTheBucketsLeader: a just-created bucket that does
// not answer yet is asked again until it does (the planner exited at
// start on a new cluster), and one that never answers is an error within
// bucketWait.
func TestPutObjectWaitsForTheBucketsLeader(t *testing.T) {
	old := bucketWait
	bucketWait = 2 * time.Second
	t.Cleanup(func() { bucketWait = old })
	s := &electingStore{unanswered: 3}
	if err := putObjectOnce(context.Background(), s, "tokenizer-x", []byte("t")); err != nil || s.puts != 1 {
		t.Fatalf("putObjectOnce = %v after %d puts; want the object put once", err, s.puts)
	}
	s = &electingStore{unanswered: 1 << 30}
	t0 := time.Now()
	err := putObjectOnce(context.Background(), s, "tokenizer-x", []byte("t"))
	if !errors.Is(err, nats.ErrNoResponders) || time.Since(t0) > bucketWait+time.Second {
		t.Fatalf("putObjectOnce on a bucket that never answers = %v after %v; want no responders within %v", err, time.Since(t0), bucketWait)
	}
}
