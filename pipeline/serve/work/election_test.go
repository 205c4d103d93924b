package work

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsCluster runs n embedded JetStream servers routed into one cluster and
// returns them once a replicated stream can be created.
func natsCluster(t *testing.T, n int) []*server.Server {
	t.Helper()
	ports := make([]int, n)
	var routes []string
	for i := range ports {
		ports[i] = freePort(t)
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	servers := make([]*server.Server, n)
	for i := range servers {
		s, err := server.NewServer(&server.Options{ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
			Cluster: server.ClusterOpts{Name: "work", Host: "127.0.0.1", Port: ports[i]},
			Routes:  server.RoutesFromStr(strings.Join(routes, ","))})
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		t.Cleanup(s.Shutdown)
		servers[i] = s
	}
	for _, s := range servers {
		if !s.ReadyForConnections(20 * time.Second) {
			t.Fatal("nats server not ready")
		}
	}
	return servers
}

// lossyJS loses the ack of every n-th stored publish, as when the stream
// leader dies after storing a message and before answering.
type lossyJS struct {
	jetstream.JetStream
	every        int64
	stored, lost atomic.Int64
}

func (l *lossyJS) Publish(ctx context.Context, subj string, b []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := l.JetStream.Publish(ctx, subj, b, opts...)
	if err == nil && l.stored.Add(1)%l.every == 0 {
		l.lost.Add(1)
		return nil, errors.New("test: the publish ack was lost")
	}
	return ack, err
}

// Work items published across elections are neither lost nor duplicated:
// on a 3-server cluster with the work queue replicated 3 times, a planner
// publishes items while acks get lost and while the server leading the work
// stream is shut down (the stream elects a new leader and publish retries);
// the queue holds each item once. Then a standby planner takes over (purges
// the job's items and issues the same items again, byte for byte), and the
// first planner after a reset does too: nothing is dropped as a duplicate of
// the earlier issue, and workers take each item exactly once.
func TestWorkPublishAcrossElections(t *testing.T) {
	servers := natsCluster(t, 3)
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.ClientURL())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	connect := func() (*nats.Conn, jetstream.JetStream) {
		nc, err := nats.Connect(strings.Join(urls, ","), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		return nc, js
	}
	nc, js := connect()
	var st jetstream.Stream
	checkFor(t, 60*time.Second, 100*time.Millisecond, func() (err error) { // until the cluster has a meta leader
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		st, err = EnsureQueue(actx, js, 3, time.Second)
		return err
	})
	const job, items = "job-e", 40
	item := func(i int) []byte { return []byte(`{"kind":"batch","id":"` + strconv.Itoa(i) + `"}`) }
	lossy := &lossyJS{JetStream: js, every: 5}
	leader, err := NewPlanner(job, 1, 4, lossy, nc, "cfg", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	queued := func() uint64 {
		var n uint64
		checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
			info, err := st.Info(ctx)
			if err != nil {
				return err
			}
			n = info.State.Msgs
			return nil
		})
		return n
	}
	for i := range items {
		if i == items/2 { // the work stream's leader dies mid-way
			info, err := st.Info(ctx)
			if err != nil || info.Cluster == nil {
				t.Fatalf("stream info: %+v, %v", info, err)
			}
			for _, s := range servers {
				if s.Name() == info.Cluster.Leader {
					s.Shutdown()
				}
			}
		}
		if err := leader.publish(ctx, item(i)); err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if lossy.lost.Load() == 0 {
		t.Fatal("no ack was lost: the test checks nothing")
	}
	if n := queued(); n != items {
		t.Fatalf("%d items queued after %d lost acks and a stream leader election, want %d", n, lossy.lost.Load(), items)
	}

	_, js2 := connect()
	standby, err := NewPlanner(job, 1, 4, js2, nc, "cfg", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*Planner{standby, leader} { // a takeover, then a rewind
		if err := p.Reset(ctx); err != nil {
			t.Fatal(err)
		}
		for i := range items {
			if err := p.publish(ctx, item(i)); err != nil {
				t.Fatal(err)
			}
		}
		if n := queued(); n != items {
			t.Fatalf("%d items queued after the same items were issued again, want %d", n, items)
		}
	}
	cons, err := st.Consumer(ctx, Consumer)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for total := 0; total < items; {
		batch, err := cons.Fetch(items, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			seen[string(m.Data())]++
			total++
			_ = m.Ack()
		}
		if batch.Error() != nil && !errors.Is(batch.Error(), nats.ErrTimeout) {
			t.Fatal(batch.Error())
		}
		if ctx.Err() != nil {
			t.Fatalf("workers took %d items of %d", total, items)
		}
	}
	for i := range items {
		if n := seen[string(item(i))]; n != 1 {
			t.Errorf("item %d taken %d times", i, n)
		}
	}
}

// silentJS never answers the first `lose` publishes (their request or ack
// left with a stream leader that died): each waits until its context ends.
// Later publishes are stored.
type silentJS struct {
	jetstream.JetStream
	lose  int32
	calls atomic.Int32
}

func (j *silentJS) Publish(ctx context.Context, subj string, b []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if j.calls.Add(1) <= j.lose {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &jetstream.PubAck{Stream: Stream, Sequence: uint64(j.calls.Load())}, nil
}

// A publish that is never answered (its request or ack was lost with the
// stream leader) is sent again after one attempt's bound, even when the
// caller's context has a far deadline: the jetstream client bounds a request
// by the context's deadline alone when there is one, so without its own
// bound an attempt waited for the whole context (the 1-in-4 "item 20:
// context deadline exceeded" of TestWorkPublishAcrossElections).
func TestWorkPublishRetriesUnansweredAttempt(t *testing.T) {
	js := &silentJS{lose: 2}
	w, err := NewPlanner("job-1", 1, 4, js, nil, "cfg", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	w.attempt = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := w.publish(ctx, []byte(`{"kind":"batch","id":"1"}`)); err != nil {
		t.Fatalf("publish after %v: %v", time.Since(t0), err)
	}
	if n := js.calls.Load(); n != 3 {
		t.Errorf("%d publish attempts, want 3 (2 unanswered)", n)
	}
}
