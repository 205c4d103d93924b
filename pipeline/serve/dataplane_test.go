package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
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
		if _, held := r.s.out.first(0); held {
			if k, _ := r.s.out.first(0); k.Step <= 2 {
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
