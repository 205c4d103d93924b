package deliver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// coreLog is CoreParts that checks ranks of job "job1" (2 ranks, mp 1) and
// records the refusals, the next steps set and the answers allowed.
type coreLog struct {
	bad     []string
	next    []proto.Pos
	refuse  bool // the reply guard refuses every reply subject
	allowed int
}

func (l *coreLog) CheckRank(job string, dp, mp int) (int, error) {
	if job != "job1" || dp < 0 || dp > 1 || mp != 0 {
		return 0, fmt.Errorf("rank dp=%d mp=%d of %s: %w", dp, mp, job, proto.ErrControl)
	}
	return dp, nil
}
func (l *coreLog) BadControl(kind string, err error) {
	if !errors.Is(err, proto.ErrControl) {
		panic(err)
	}
	l.bad = append(l.bad, kind)
}
func (l *coreLog) SetNext(_ int, next proto.Pos, _ bool) { l.next = append(l.next, next) }
func (l *coreLog) Allow(string, *nats.Msg, int, int) bool {
	l.allowed++
	return !l.refuse
}
func (l *coreLog) StartView(context.Context, int, string, proto.BatchKey)       {}
func (l *coreLog) SubscribeViews(context.Context) ([]*nats.Subscription, error) { return nil, nil }
func (l *coreLog) Start(func(context.Context)) bool                             { return false }
func (l *coreLog) Fetched(string)                                               {}
func (l *coreLog) Sent(int, time.Duration)                                      {}
func (l *coreLog) SendFailed(proto.BatchKey, error)                             {}
func (l *coreLog) HandFailed(int, error)                                        {}
func (l *coreLog) Recording() bool                                              { return true }

func newTestCore(t *testing.T) (*Core, *Outbox, *Ranks, *coreLog) {
	t.Helper()
	book := epochs.NewBook(nil, nil)
	book.SetInfo(0, epochs.Info{Epoch: 0, Steps: 4})
	book.SetInfo(1, epochs.Info{Epoch: 1, Steps: 4})
	tab := NewRanks(2, 1, book, newMemStore())
	out := NewOutbox(2, 1<<20)
	parts := &coreLog{}
	lay := CoreLayout{Job: "job1", Ranks: 2, MP: 1, FirstEpoch: 0, LastEpoch: 1, MicroBatches: 2, ChunkSize: 4096}
	return NewCore(nil, lay, out, tab, NewPublisher(), parts), out, tab, parts
}

func ackMsg(t *testing.T, subjDP int, k proto.BatchKey) *nats.Msg {
	t.Helper()
	subj, _ := proto.AckSubject("job1", subjDP, 0)
	b, err := json.Marshal(proto.AckRequest(proto.NewFetchRequest(k)))
	if err != nil {
		t.Fatal(err)
	}
	return &nats.Msg{Subject: subj, Data: b}
}

// TestHandleAckDropsOnlyHandedBatches: an ack of rank 0's handed last
// micro-batch drops it from the outbox and records the rank's next step; an
// ack on another rank's subject, of a batch not handed, or whose reply the
// guard refuses moves nothing.
func TestHandleAckDropsOnlyHandedBatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, out, tab, parts := newTestCore(t)
	k0 := proto.BatchKey{Job: "job1", Step: 0, MicroBatch: 0}
	k1 := proto.BatchKey{Job: "job1", Step: 0, MicroBatch: 1}
	for _, k := range []proto.BatchKey{k0, k1} {
		if err := out.Put(ctx, 0, NewItem(k, 0, []byte("batch"))); err != nil {
			t.Fatal(err)
		}
	}
	c.HandleAck(ackMsg(t, 0, k1)) // not handed yet
	if err := tab.Hand(ctx, 0, k1); err != nil {
		t.Fatal(err)
	}
	c.HandleAck(ackMsg(t, 1, k1)) // rank 0's ack on rank 1's subject
	parts.refuse = true
	c.HandleAck(ackMsg(t, 0, k1)) // a reply subject the guard refuses
	parts.refuse = false
	if _, ok := out.First(0); !ok || len(parts.next) > 0 || len(parts.bad) != 2 {
		t.Fatalf("refused acks: outbox holds a batch %v, next %v, refusals %v; want the batches held, no next, 2 refusals", ok, parts.next, parts.bad)
	}
	c.HandleAck(ackMsg(t, 0, k1))
	if _, ok := out.First(0); ok || len(parts.next) != 1 || parts.next[0] != (proto.Pos{Step: 1}) || len(parts.bad) != 2 {
		t.Errorf("handed ack: outbox holds a batch %v, next %v, refusals %v; want nothing held, next step 1", ok, parts.next, parts.bad)
	}
}

// TestCheckFetchRefusesOutsideTheRank: a fetch is accepted on its rank's
// own subject with a reply subject and an epoch of the job; a viewer's
// fetch only needs its reply subject.
func TestCheckFetchRefusesOutsideTheRank(t *testing.T) {
	c, _, _, _ := newTestCore(t)
	k := proto.BatchKey{Job: "job1", Epoch: 1, Step: 0, MicroBatch: 0, DPRank: 1}
	msg := func(req proto.FetchRequest, reply string) *nats.Msg {
		b, _ := json.Marshal(req)
		return &nats.Msg{Data: b, Reply: reply}
	}
	late := k
	late.Epoch = 2
	view := proto.NewFetchRequest(late)
	view.View = true
	for _, tc := range []struct {
		name string
		rank int
		m    *nats.Msg
		ok   bool
	}{
		{"own rank", 1, msg(proto.NewFetchRequest(k), "inbox"), true},
		{"another rank's subject", 0, msg(proto.NewFetchRequest(k), "inbox"), false},
		{"no reply subject", 1, msg(proto.NewFetchRequest(k), ""), false},
		{"epoch after the job", 1, msg(proto.NewFetchRequest(late), "inbox"), false},
		{"viewer", 1, msg(view, "inbox"), true},
		{"not a request", 1, &nats.Msg{Data: []byte("{"), Reply: "inbox"}, false},
	} {
		_, err := c.CheckFetch(tc.rank, tc.m)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, proto.ErrControl)) {
			t.Errorf("%s: err %v, want accepted %v (refusals wrap ErrControl)", tc.name, err, tc.ok)
		}
	}
}
