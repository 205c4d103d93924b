package serve

import (
	"context"
	"fmt"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// fetchesInFlight bounds the batches of one rank that fetches wait for (or
// are being answered) at once. A fetch for another batch beyond it is
// dropped; the rank asks again after its timeout.
const fetchesInFlight = 32

// subscribeData installs the core data plane's handlers: one fetch
// subscription per rank and one ack subscription for all ranks. Each batch
// a rank asks for is answered (deliver.Fetches.Answer) on its own goroutine
// (at most fetchesInFlight per rank), so a fetch that waits for its batch
// never holds up the rank's other fetches: after a reconnect a rank asks
// again for batches the service holds while an older fetch still waits for
// a batch that cannot be built until those are acknowledged. A fetch for a
// batch that an earlier fetch of the rank still waits for joins that wait
// (deliver.FetchWaits): the batch is sent once, so a rank that keeps asking
// while it starves neither fills its slots nor gets copies. ctx ends the
// waits.
func (s *Service) subscribeData(ctx context.Context) ([]*nats.Subscription, error) {
	var subs []*nats.Subscription
	fetches := deliver.NewFetches(s.out, s.ranks, s.publisher, fetchGlue{s})
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
		waits := deliver.NewFetchWaits()
		sub, err := s.nc.Subscribe(subj, func(m *nats.Msg) {
			req, err := s.checkFetch(r, m)
			if err != nil {
				s.ctl.BadControl("fetch", err)
				return
			}
			if !s.replies.Allow("fetch", m, s.replies.RankInbox(dp, mp)...) {
				return // the batch would go to someone else's inbox
			}
			key := req.Key()
			if req.View {
				s.startView(ctx, r, m.Reply, key)
				return
			}
			w := waits.Join(key, m.Reply, time.Now())
			if w == nil {
				s.met.control.WithLabelValues("fetch", "merged").Inc()
				return // an earlier fetch of the batch waits, and now answers this one
			}
			select {
			case slots <- struct{}{}:
				s.met.control.WithLabelValues("fetch", "ok").Inc()
				if !s.tasks.start(func(context.Context) {
					defer func() { <-slots }()
					fetches.Answer(ctx, r, key, waits, w)
				}) {
					<-slots
					waits.Leave(key, w)
				}
			default:
				waits.Leave(key, w)
				s.ctl.BadControl("fetch", fmt.Errorf("serve: rank %d has %d fetches in flight: %w", r, fetchesInFlight, proto.ErrControl))
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

// checkFetch decodes and checks a FetchRequest on rank's fetch subject.
func (s *Service) checkFetch(rank int, m *nats.Msg) (proto.FetchRequest, error) {
	var req proto.FetchRequest
	err := proto.DecodeControl(m.Data, &req)
	if err == nil {
		var r int
		if r, err = s.ctl.CheckRank(req.Job, req.DPRank, req.MPRank); err == nil && r != rank {
			err = fmt.Errorf("serve: fetch for rank dp=%d mp=%d on another rank's subject: %w", req.DPRank, req.MPRank, proto.ErrControl)
		}
	}
	if err == nil && req.View && m.Reply != "" {
		return req, nil
	}
	if err == nil && (m.Reply == "" || req.Epoch < s.cfg.Pipeline.Plan.Epoch || req.Epoch > s.cfg.lastEpoch()) {
		err = fmt.Errorf("serve: fetch of %v: no reply subject or epoch outside the job: %w", req.Key(), proto.ErrControl)
	}
	return req, err
}

// send publishes one held batch to a fetch's reply inbox.
func (s *Service) send(reply string, it *deliver.Item) {
	t0 := time.Now()
	n, err := proto.SendBatch(s.nc, reply, it.Key(), it.Gen(), it.Payload(), it.Sum(), s.chunkSize)
	s.met.stage(stagePublish, time.Since(t0))
	s.met.chunks.Add(float64(n))
	s.met.nChunks.Add(int64(n))
	if err != nil {
		s.log.Warn("send batch", "batch", it.Key().String(), "err", err)
	}
}

// handleAck drops the batches a rank acknowledged and, after a step's last
// micro-batch, records the rank's position.
func (s *Service) handleAck(m *nats.Msg) {
	var a proto.AckRequest
	err := proto.DecodeControl(m.Data, &a)
	rank := 0
	if err == nil {
		rank, err = s.ctl.CheckRank(a.Job, a.DPRank, a.MPRank)
	}
	if err == nil {
		if want, _ := proto.AckSubject(a.Job, a.DPRank, a.MPRank); want != m.Subject {
			err = fmt.Errorf("serve: ack for rank dp=%d mp=%d on %s: %w", a.DPRank, a.MPRank, m.Subject, proto.ErrControl)
		}
	}
	if err != nil {
		s.ctl.BadControl("ack", err)
		return
	}
	if !s.replies.Allow("ack", m, s.replies.RankInbox(a.DPRank, a.MPRank)...) {
		return
	}
	if err := s.ranks.CheckAck(rank, a.Key(), s.cfg.Pipeline.Plan.MicroBatches); err != nil {
		s.ctl.BadControl("ack", err)
		return
	}
	s.out.Ack(rank, a.Key())
	if failing, _ := s.health.stateFailure(time.Now()); m.Reply != "" && failing == nil {
		// Not while the job's state cannot be written (a full disk): the
		// rank asks again and waits, instead of training past what the
		// service can record.
		// Before the position moves: the last ack of the job lets the
		// service finish and close its connection, and the rank must still
		// get its answer. A crash between the answer and the KV write only
		// rebuilds that step, which the rank no longer asks for.
		_ = m.Respond(nil)
	}
	if a.MicroBatch == s.cfg.Pipeline.Plan.MicroBatches-1 {
		s.ctl.SetNext(rank, pos{Epoch: a.Epoch, Step: a.Step + 1}, false)
	}
}
