package serve

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// fetchWait bounds how long a fetch waits for its batch to be built; the
// rank asks again after its own timeout.
const fetchWait = 2 * time.Minute

// fetchesInFlight bounds the fetches of one rank answered at once. A fetch
// beyond it is dropped; the rank asks again after its timeout.
const fetchesInFlight = 32

// subscribeData installs the core data plane's handlers: one fetch
// subscription per rank and one ack subscription for all ranks. Each fetch
// is answered on its own goroutine (at most fetchesInFlight per rank), so a
// fetch that waits for its batch never holds up the rank's other fetches:
// after a reconnect a rank asks again for batches the service holds while an
// older fetch still waits for a batch that cannot be built until those are
// acknowledged. ctx ends the waits.
func (s *Service) subscribeData(ctx context.Context) ([]*nats.Subscription, error) {
	var subs []*nats.Subscription
	fail := func(err error) ([]*nats.Subscription, error) {
		for _, x := range subs {
			_ = x.Unsubscribe()
		}
		return nil, err
	}
	for r := range s.cfg.ranks() {
		dp, mp := r/s.cfg.MP, r%s.cfg.MP
		subj, err := proto.FetchSubject(s.cfg.Job, dp, mp)
		if err != nil {
			return fail(err)
		}
		slots := make(chan struct{}, fetchesInFlight)
		sub, err := s.nc.Subscribe(subj, func(m *nats.Msg) {
			select {
			case slots <- struct{}{}:
				if !s.tasks.start(func(context.Context) {
					defer func() { <-slots }()
					s.handleFetch(ctx, r, m)
				}) {
					<-slots
				}
			default:
				s.ctl.badControl("fetch", fmt.Errorf("serve: rank %d has %d fetches in flight: %w", r, fetchesInFlight, proto.ErrControl))
			}
		})
		if err != nil {
			return fail(fmt.Errorf("serve: subscribe %s: %w", subj, err))
		}
		subs = append(subs, sub)
	}
	vsubs, err := s.subscribeViews(ctx)
	if err != nil {
		return fail(err)
	}
	subs = append(subs, vsubs...)
	subj, err := proto.AckWildcard(s.cfg.Job)
	if err != nil {
		return fail(err)
	}
	sub, err := s.nc.Subscribe(subj, s.handleAck)
	if err != nil {
		return fail(fmt.Errorf("serve: subscribe %s: %w", subj, err))
	}
	subs = append(subs, sub)
	if err := s.nc.Flush(); err != nil {
		return fail(fmt.Errorf("serve: subscribe: %w", err))
	}
	return subs, nil
}

// handleFetch answers one FetchRequest of rank: it sends the batch's chunks
// to the reply inbox as soon as the outbox holds the batch. A batch that was
// built and is no longer held (the rank acknowledged it, then restarted from
// an older checkpoint; or it was purged) is regenerated: the rank is rewound
// to the batch's step with a new generation, and the batch is sent once it
// is built again. The plan and the preprocessing are deterministic, so the
// regenerated payload is byte-identical.
func (s *Service) handleFetch(ctx context.Context, rank int, m *nats.Msg) {
	var req proto.FetchRequest
	err := proto.DecodeControl(m.Data, &req)
	if err == nil {
		var r int
		if r, err = s.ctl.checkRank(req.Job, req.DPRank, req.MPRank); err == nil && r != rank {
			err = fmt.Errorf("serve: fetch for rank dp=%d mp=%d on another rank's subject: %w", req.DPRank, req.MPRank, proto.ErrControl)
		}
	}
	if err == nil && req.View && m.Reply != "" {
		s.startView(ctx, rank, m.Reply, req.Key())
		return
	}
	if err == nil && (m.Reply == "" || req.Epoch < s.cfg.Pipeline.Plan.Epoch || req.Epoch > s.cfg.lastEpoch()) {
		err = fmt.Errorf("serve: fetch of %v: no reply subject or epoch outside the job: %w", req.Key(), proto.ErrControl)
	}
	if err != nil {
		s.ctl.badControl("fetch", err)
		return
	}
	key := req.Key()
	t := time.NewTimer(fetchWait)
	defer t.Stop()
	rewound, waiting := false, false
	for {
		it, changed := s.out.lookup(rank, key)
		if it != nil {
			s.send(m.Reply, it)
			return
		}
		if !waiting {
			waiting = true
			defer s.out.want(rank, key)()
		}
		if !rewound && s.dropped(rank, key) {
			rewound = true
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := s.requestRewind(rctx, rewindReq{rank: rank, to: pos{key.Epoch, key.Step}, reason: "fetch of a batch no longer held"})
			cancel()
			if err != nil {
				return
			}
		}
		select {
		case <-changed:
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// dropped reports whether key was built for rank and is no longer held.
func (s *Service) dropped(rank int, key proto.BatchKey) bool {
	built := (pos{key.Epoch, key.Step}).less(s.ranks.get(rank).cursor)
	if !built {
		return false
	}
	it, _ := s.out.lookup(rank, key)
	return it == nil
}

// send publishes one held batch to a fetch's reply inbox.
func (s *Service) send(reply string, it *outItem) {
	t0 := time.Now()
	n, err := proto.SendBatch(s.nc, reply, it.key, it.gen, it.payload, it.sum, s.chunkSize)
	s.met.stage(stagePublish, time.Since(t0))
	s.met.chunks.Add(float64(n))
	s.met.nChunks.Add(int64(n))
	if err != nil {
		s.log.Warn("send batch", "batch", it.key.String(), "err", err)
	}
}

// handleAck drops the batches a rank acknowledged and, after a step's last
// micro-batch, records the rank's position.
func (s *Service) handleAck(m *nats.Msg) {
	var a proto.AckRequest
	err := proto.DecodeControl(m.Data, &a)
	rank := 0
	if err == nil {
		rank, err = s.ctl.checkRank(a.Job, a.DPRank, a.MPRank)
	}
	if err == nil {
		if want, _ := proto.AckSubject(a.Job, a.DPRank, a.MPRank); want != m.Subject {
			err = fmt.Errorf("serve: ack for rank dp=%d mp=%d on %s: %w", a.DPRank, a.MPRank, m.Subject, proto.ErrControl)
		}
	}
	if err != nil {
		s.ctl.badControl("ack", err)
		return
	}
	s.out.ack(rank, a.Key())
	if m.Reply != "" {
		// Before the position moves: the last ack of the job lets the
		// service finish and close its connection, and the rank must still
		// get its answer. A crash between the answer and the KV write only
		// rebuilds that step, which the rank no longer asks for.
		_ = m.Respond(nil)
	}
	if a.MicroBatch == s.cfg.Pipeline.Plan.MicroBatches-1 {
		s.ctl.setNext(context.Background(), rank, pos{a.Epoch, a.Step + 1}, false)
	}
}

// firstHeld returns the first batch still held for a rank (the outbox on the
// core data plane, the stream otherwise) and whether it is whole.
func (s *Service) firstHeld(ctx context.Context, rank int) (proto.ChunkHeader, bool, error) {
	if !s.cfg.core() {
		return s.firstStored(ctx, rank/s.cfg.MP, rank%s.cfg.MP)
	}
	k, ok := s.out.first(rank)
	return proto.ChunkHeader{BatchKey: k}, ok, nil
}

// dataPlaneReply fills the data plane fields of a register reply.
func (s *Service) dataPlaneReply(rep *proto.RegisterReply, dp, mp int) {
	rep.DataPlane = s.cfg.DataPlane
	if s.cfg.core() {
		rep.FetchSubject, _ = proto.FetchSubject(s.cfg.Job, dp, mp)
		rep.AckSubject, _ = proto.AckSubject(s.cfg.Job, dp, mp)
	}
}

// resetConsumer recreates a rank's durable consumer when an earlier
// incarnation of the trainer left chunks delivered and unacknowledged: the new
// consumer delivers everything still stored, in order, at once, instead of
// after AckWait. Work-queue retention keeps unacknowledged chunks in the
// stream while no consumer exists.
func (s *Service) resetConsumer(ctx context.Context, dp, mp int) error {
	name := proto.ConsumerName(s.cfg.Job, dp, mp)
	cons, err := s.stream.Consumer(ctx, name)
	if err == nil {
		var ci *jetstream.ConsumerInfo
		if ci, err = cons.Info(ctx); err == nil && ci.NumAckPending == 0 {
			return nil
		}
	}
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("serve: consumer %s: %w", name, err)
	}
	if err == nil {
		if err := s.stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("serve: reset consumer %s: %w", name, err)
		}
		s.log.Info("consumer reset: redelivering unacknowledged chunks", "dp", dp, "mp", mp)
	}
	cc := proto.DefaultConsumerConfig(s.cfg.Job, dp, mp)
	cc.MaxAckPending, cc.AckWait = s.cfg.MaxAckPending, s.cfg.AckWait
	if _, err := proto.EnsureConsumer(ctx, s.js, cc); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
