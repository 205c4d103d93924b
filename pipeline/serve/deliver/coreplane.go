package deliver

import (
	"context"
	"fmt"
	"time"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// fetchesInFlight bounds the batches of one rank that fetches wait for (or
// are being answered) at once. A fetch for another batch beyond it is
// dropped; the rank asks again after its timeout.
const fetchesInFlight = 32

// CoreLayout is the job's layout as the core data plane's handlers check
// the requests against it: the job, the ranks (MP per dp rank), the epochs
// it serves (FirstEpoch to LastEpoch), the micro-batches of a step and the
// data bytes of one chunk message.
type CoreLayout struct {
	Job                   string
	Ranks, MP             int
	FirstEpoch, LastEpoch int
	MicroBatches          int
	ChunkSize             int
}

// HandlerParts is what the core data plane's handlers need of the service:
// control's checks and records (CheckRank, BadControl, SetNext), the reply
// guard (Allow: the reply subject of a request of rank dp, mp may get an
// answer), the handlers' task group (Start: false once the service stops),
// the metrics and logs (Fetched, Sent, SendFailed, HandFailed) and whether
// the job's state can be written now (Recording: not while the disk is
// full).
type HandlerParts interface {
	CheckRank(job string, dp, mp int) (int, error)
	BadControl(kind string, err error)
	SetNext(rank int, next proto.Pos, force bool)
	Allow(kind string, m *nats.Msg, dp, mp int) bool
	Start(f func(context.Context)) bool
	Fetched(result string)
	Sent(chunks int, took time.Duration)
	SendFailed(key proto.BatchKey, err error)
	HandFailed(rank int, err error)
	Recording() bool
}

// CoreParts is what Core needs: the service's HandlerParts and the viewers
// (StartView, SubscribeViews: the core plane's, view.go).
type CoreParts interface {
	HandlerParts
	StartView(ctx context.Context, rank int, reply string, key proto.BatchKey)
	SubscribeViews(ctx context.Context) ([]*nats.Subscription, error)
}

// Core is the core data plane's handlers: the ranks' fetches and acks on
// the service's connection, answered from the outbox and the rank table.
type Core struct {
	nc      *nats.Conn
	lay     CoreLayout
	out     *Outbox
	ranks   *Ranks
	parts   CoreParts
	fetches *Fetches
}

// NewCore returns the core data plane's handlers over nc, the outbox, the
// rank table and the publisher (a dropped batch's rewind).
func NewCore(nc *nats.Conn, lay CoreLayout, out *Outbox, ranks *Ranks, pub *Publisher, parts CoreParts) *Core {
	c := &Core{nc: nc, lay: lay, out: out, ranks: ranks, parts: parts}
	c.fetches = NewFetches(out, ranks, pub, coreFetchParts{c})
	return c
}

// coreFetchParts is the fetch answer's FetchParts: the send is the Core's.
type coreFetchParts struct{ c *Core }

func (p coreFetchParts) Send(reply string, it *Item)    { p.c.Send(reply, it) }
func (p coreFetchParts) HandFailed(rank int, err error) { p.c.parts.HandFailed(rank, err) }

// Subscribe installs the core data plane's handlers: one fetch
// subscription per rank and one ack subscription for all ranks. Each batch
// a rank asks for is answered (Fetches.Answer) on its own goroutine
// (at most fetchesInFlight per rank), so a fetch that waits for its batch
// never holds up the rank's other fetches: after a reconnect a rank asks
// again for batches the service holds while an older fetch still waits for
// a batch that cannot be built until those are acknowledged. A fetch for a
// batch that an earlier fetch of the rank still waits for joins that wait
// (FetchWaits): the batch is sent once, so a rank that keeps asking
// while it starves neither fills its slots nor gets copies. ctx ends the
// waits.
func (c *Core) Subscribe(ctx context.Context) ([]*nats.Subscription, error) {
	var subs []*nats.Subscription
	fail := func(err error) ([]*nats.Subscription, error) {
		for _, x := range subs {
			_ = x.Unsubscribe()
		}
		return nil, err
	}
	for r := range c.lay.Ranks {
		sub, err := c.subscribeFetch(ctx, r)
		if err != nil {
			return fail(err)
		}
		subs = append(subs, sub)
	}
	vsubs, err := c.parts.SubscribeViews(ctx)
	if err != nil {
		return fail(err)
	}
	subs = append(subs, vsubs...)
	subj, err := proto.AckWildcard(c.lay.Job)
	if err != nil {
		return fail(err)
	}
	sub, err := c.nc.Subscribe(subj, c.HandleAck)
	if err != nil {
		return fail(fmt.Errorf("serve: subscribe %s: %w", subj, err))
	}
	subs = append(subs, sub)
	if err := c.nc.Flush(); err != nil {
		return fail(fmt.Errorf("serve: subscribe: %w", err))
	}
	return subs, nil
}

// subscribeFetch subscribes rank r's fetch subject.
func (c *Core) subscribeFetch(ctx context.Context, r int) (*nats.Subscription, error) {
	dp, mp := r/c.lay.MP, r%c.lay.MP
	subj, err := proto.FetchSubject(c.lay.Job, dp, mp)
	if err != nil {
		return nil, err
	}
	slots := make(chan struct{}, fetchesInFlight)
	waits := NewFetchWaits()
	sub, err := c.nc.Subscribe(subj, func(m *nats.Msg) {
		req, err := c.CheckFetch(r, m)
		if err != nil {
			c.parts.BadControl("fetch", err)
			return
		}
		if !c.parts.Allow("fetch", m, dp, mp) {
			return // the batch would go to someone else's inbox
		}
		key := req.Key()
		if req.View {
			c.parts.StartView(ctx, r, m.Reply, key)
			return
		}
		w := waits.Join(key, m.Reply, time.Now())
		if w == nil {
			c.parts.Fetched("merged")
			return // an earlier fetch of the batch waits, and now answers this one
		}
		select {
		case slots <- struct{}{}:
			c.parts.Fetched("ok")
			if !c.parts.Start(func(context.Context) {
				defer func() { <-slots }()
				c.fetches.Answer(ctx, r, key, waits, w)
			}) {
				<-slots
				waits.Leave(key, w)
			}
		default:
			waits.Leave(key, w)
			c.parts.BadControl("fetch", fmt.Errorf("serve: rank %d has %d fetches in flight: %w", r, fetchesInFlight, proto.ErrControl))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("serve: subscribe %s: %w", subj, err)
	}
	return sub, nil
}

// CheckFetch decodes and checks a FetchRequest on rank's fetch subject.
func (c *Core) CheckFetch(rank int, m *nats.Msg) (proto.FetchRequest, error) {
	var req proto.FetchRequest
	err := proto.DecodeControl(m.Data, &req)
	if err == nil {
		var r int
		if r, err = c.parts.CheckRank(req.Job, req.DPRank, req.MPRank); err == nil && r != rank {
			err = fmt.Errorf("serve: fetch for rank dp=%d mp=%d on another rank's subject: %w", req.DPRank, req.MPRank, proto.ErrControl)
		}
	}
	if err == nil && req.View && m.Reply != "" {
		return req, nil
	}
	if err == nil && (m.Reply == "" || req.Epoch < c.lay.FirstEpoch || req.Epoch > c.lay.LastEpoch) {
		err = fmt.Errorf("serve: fetch of %v: no reply subject or epoch outside the job: %w", req.Key(), proto.ErrControl)
	}
	return req, err
}

// Send publishes one held batch to a fetch's reply inbox.
func (c *Core) Send(reply string, it *Item) {
	t0 := time.Now()
	n, err := proto.SendBatch(c.nc, reply, it.Key(), it.Gen(), it.Payload(), it.Sum(), c.lay.ChunkSize)
	c.parts.Sent(n, time.Since(t0))
	if err != nil {
		c.parts.SendFailed(it.Key(), err)
	}
}

// HandleAck drops the batches a rank acknowledged and, after a step's last
// micro-batch, records the rank's position.
func (c *Core) HandleAck(m *nats.Msg) {
	var a proto.AckRequest
	err := proto.DecodeControl(m.Data, &a)
	rank := 0
	if err == nil {
		rank, err = c.parts.CheckRank(a.Job, a.DPRank, a.MPRank)
	}
	if err == nil {
		if want, _ := proto.AckSubject(a.Job, a.DPRank, a.MPRank); want != m.Subject {
			err = fmt.Errorf("serve: ack for rank dp=%d mp=%d on %s: %w", a.DPRank, a.MPRank, m.Subject, proto.ErrControl)
		}
	}
	if err != nil {
		c.parts.BadControl("ack", err)
		return
	}
	if !c.parts.Allow("ack", m, a.DPRank, a.MPRank) {
		return
	}
	if err := c.ranks.CheckAck(rank, a.Key(), c.lay.MicroBatches); err != nil {
		c.parts.BadControl("ack", err)
		return
	}
	c.out.Ack(rank, a.Key())
	if m.Reply != "" && c.parts.Recording() {
		// Not while the job's state cannot be written (a full disk): the
		// rank asks again and waits, instead of training past what the
		// service can record.
		// Before the position moves: the last ack of the job lets the
		// service finish and close its connection, and the rank must still
		// get its answer. A crash between the answer and the KV write only
		// rebuilds that step, which the rank no longer asks for.
		_ = m.Respond(nil)
	}
	if a.MicroBatch == c.lay.MicroBatches-1 {
		c.parts.SetNext(rank, proto.Pos{Epoch: a.Epoch, Step: a.Step + 1}, false)
	}
}
