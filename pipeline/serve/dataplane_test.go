package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// rawRank is a bare core data plane client: it asks for one batch at a time
// and keeps the payload bytes and the generation it came with.
type rawRank struct {
	t     *testing.T
	nc    *nats.Conn
	job   string
	dp    int
	inbox string
	ch    chan *nats.Msg
}

func newRawRank(t *testing.T, url, job string, dp int) *rawRank {
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	r := &rawRank{t: t, nc: nc, job: job, dp: dp, inbox: nc.NewInbox(), ch: make(chan *nats.Msg, 64)}
	if _, err := nc.ChanSubscribe(r.inbox, r.ch); err != nil {
		t.Fatal(err)
	}
	return r
}

// fetch asks for (epoch, step, mb) and returns the reassembled payload and
// its header.
func (r *rawRank) fetch(epoch, step, mb int) (proto.ChunkHeader, []byte) {
	r.t.Helper()
	k := proto.BatchKey{Job: r.job, Epoch: epoch, Step: step, MicroBatch: mb, DPRank: r.dp}
	b, _ := json.Marshal(proto.NewFetchRequest(k))
	subj, _ := proto.FetchSubject(r.job, r.dp, 0)
	if err := r.nc.PublishRequest(subj, r.inbox, b); err != nil {
		r.t.Fatal(err)
	}
	var msgs []*nats.Msg
	for {
		select {
		case m := <-r.ch:
			msgs = append(msgs, m)
			h, err := proto.ParseChunkHeader(m.Header)
			if err != nil {
				r.t.Fatal(err)
			}
			if len(msgs) < h.Count {
				continue
			}
			h, payload, err := proto.Reassemble(msgs, 1<<30)
			if err != nil {
				r.t.Fatal(err)
			}
			if h.BatchKey != k {
				r.t.Fatalf("asked for %v, got %v", k, h.BatchKey)
			}
			return h, payload
		case <-time.After(30 * time.Second):
			r.t.Fatalf("no answer to the fetch of %v", k)
		}
	}
}

func (r *rawRank) ack(epoch, step, mb int) {
	r.t.Helper()
	k := proto.BatchKey{Job: r.job, Epoch: epoch, Step: step, MicroBatch: mb, DPRank: r.dp}
	b, _ := json.Marshal(proto.AckRequest(proto.NewFetchRequest(k)))
	subj, _ := proto.AckSubject(r.job, r.dp, 0)
	if _, err := r.nc.Request(subj, b, 10*time.Second); err != nil {
		r.t.Fatal(err)
	}
}

// A batch the rank acknowledged and asks for again (a restart from an older
// checkpoint, a payload lost after the ack) is regenerated from the plan
// with the next generation, byte for byte the same payload.
func TestRegeneratedBatchIsByteIdentical(t *testing.T) {
	cfg := testConfig(t, corpus(t, 48), 1, 1, "colocated")
	cfg.Recalibrate, cfg.WaitForTrainers = -1, true
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tr := newTrainer(t, cfg, r.s.ClientURL(), 0, 0)
	if err := tr.connect(ctx); err != nil {
		t.Fatal(err)
	}
	defer tr.crash()
	if rep, err := tr.register(ctx, 0, 0); err != nil || !rep.OK || rep.DataPlane != proto.DataPlaneCore {
		t.Fatalf("register: %+v, %v", rep, err)
	}
	rank := newRawRank(t, r.s.ClientURL(), cfg.Job, 0)
	var first [][]byte
	for step := range 3 {
		for mb := range 2 {
			h, p := rank.fetch(0, step, mb)
			if h.Gen != 0 {
				t.Fatalf("first publish of %v has generation %d", h.BatchKey, h.Gen)
			}
			first = append(first, p)
		}
	}
	rank.ack(0, 2, 1) // steps 0..2 applied: the service drops them
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if _, held := firstHeld(r.s, 0); held {
			if k, _ := firstHeld(r.s, 0); k.Step <= 2 {
				return errorf("outbox still holds %v", k)
			}
		}
		return nil
	})
	for i, step := range []int{1, 1, 2, 2} { // a restart from the checkpoint of step 0
		h, p := rank.fetch(0, step, i%2)
		if h.Gen != 1 {
			t.Errorf("regenerated %v has generation %d, want 1", h.BatchKey, h.Gen)
		}
		if want := first[2*step+i%2]; !bytes.Equal(p, want) {
			t.Errorf("regenerated %v: %d bytes differ from the first %d", h.BatchKey, len(p), len(want))
		}
	}
	if got := counter(t, r.s, "mmfeed_serve_rewinds_total"); got != 1 {
		t.Errorf("rewinds = %v, want 1", got)
	}
}

// A rank that starves (its batches are not built yet) and asks again every
// 100 ms for its window of 4 batches gets each batch once, on the newest
// fetch's reply subject, when it is built 2 s later: every fetch for a batch
// joins the one fetch that waits for it, so 80 fetches neither take the
// rank's 32 fetch slots (no "fetches in flight" refusal) nor send copies.
func TestStarvingRankGetsEachBatchOnce(t *testing.T) {
	cfg := testConfig(t, corpus(t, 8), 1, 1, "colocated")
	cfg.StreamMaxBytes = 1 << 30
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := testnats.Server(t, testnats.Options{MaxPayload: 4096 + proto.HeaderBudget}) // 4096 data bytes a chunk
	s.nc, _ = testnats.Connect(t, srv.ClientURL())
	ctx, cancel := context.WithCancel(context.Background())
	s.tasks.open(ctx)
	stop := func() { cancel(); s.tasks.close() }
	t.Cleanup(stop)
	if err := s.plane.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.plane.Subscribe(ctx); err != nil {
		t.Fatal(err)
	}

	nc, _ := testnats.Connect(t, srv.ClientURL())
	old, newest := nc.NewInbox(), nc.NewInbox() // the trainer's inbox, then its restarted incarnation's
	got := map[string]chan *nats.Msg{old: make(chan *nats.Msg, 1024), newest: make(chan *nats.Msg, 1024)}
	for inbox, ch := range got {
		if _, err := nc.ChanSubscribe(inbox, ch); err != nil {
			t.Fatal(err)
		}
	}
	var keys []proto.BatchKey
	for step := range 2 {
		for mb := range 2 {
			keys = append(keys, proto.BatchKey{Job: cfg.Job, Epoch: 0, Step: step, MicroBatch: mb})
		}
	}
	subj, _ := proto.FetchSubject(cfg.Job, 0, 0)
	const rounds = 20 // every 100 ms for 2 s
	for i := range rounds {
		inbox := old
		if i == rounds-1 {
			inbox = newest
		}
		for _, k := range keys {
			b, _ := json.Marshal(proto.NewFetchRequest(k))
			if err := nc.PublishRequest(subj, inbox, b); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	fetches := func(result string) float64 {
		return testutil.ToFloat64(s.met.control.WithLabelValues("fetch", result))
	}
	checkFor(t, 20*time.Second, 10*time.Millisecond, func() error { // every fetch was taken before the batches are built
		if n := fetches("ok") + fetches("merged") + fetches("refused"); n != rounds*float64(len(keys)) {
			return errorf("%v fetches handled of %d", n, rounds*len(keys))
		}
		return nil
	})
	payload := bytes.Repeat([]byte("mmfeed"), 1700) // 3 chunks of 4096 bytes
	for _, k := range keys {
		if err := s.plane.Hold(ctx, 0, deliver.NewOut(k, 0, payload, k.MicroBatch == 1), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	want := 3 * len(keys) // one copy of each batch
	checkFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if n := len(got[old]) + len(got[newest]); n < want {
			return errorf("%d chunks received, want %d", n, want)
		}
		return nil
	})
	stop() // every fetch task has ended: whatever was sent is on the server
	for _, c := range []*nats.Conn{s.nc, nc} {
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(got[newest]); n != want {
		t.Errorf("%d chunks on the newest fetch's inbox, want %d (each batch once)", n, want)
	}
	if n := len(got[old]); n != 0 {
		t.Errorf("%d chunks on the inbox of the superseded fetches, want 0", n)
	}
	if n := s.met.nChunks.Load(); n != int64(want) {
		t.Errorf("%d chunks sent, want %d", n, want)
	}
	if n := fetches("refused"); n != 0 {
		t.Errorf("%v fetches refused (fetches in flight), want 0", n)
	}
	if ok, merged := fetches("ok"), fetches("merged"); ok != float64(len(keys)) || merged != float64((rounds-1)*len(keys)) {
		t.Errorf("%v fetches waited and %v joined them, want %d and %d", ok, merged, len(keys), (rounds-1)*len(keys))
	}
	seen := map[proto.BatchKey]int{}
	for len(got[newest]) > 0 {
		h, err := proto.ParseChunkHeader((<-got[newest]).Header)
		if err != nil {
			t.Fatal(err)
		}
		seen[h.BatchKey]++
	}
	for _, k := range keys {
		if seen[k] != 3 {
			t.Errorf("%v: %d chunks, want 3", k, seen[k])
		}
	}
}
