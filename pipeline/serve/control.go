package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// controlGate bounds what a flood of control messages can start: registers
// waiting at once (each may wait for a plan or a rewind) and resends in
// flight (one per rank; a resend arriving while the rank's previous one is
// still being applied is merged into it).
type controlGate struct {
	registers chan struct{}
	mu        sync.Mutex
	resending map[int]bool
}

// maxWaitingRegisters is the registers one service lets wait at once: twice
// the world size (every rank registering for this and the next epoch) plus
// slack; more are refused with code "failed" (register again later).
func maxWaitingRegisters(world int) int { return 2*world + 8 }

func newControlGate(world int) *controlGate {
	return &controlGate{registers: make(chan struct{}, maxWaitingRegisters(world)), resending: map[int]bool{}}
}

// startResend reports whether a resend for rank may start (none in flight).
func (g *controlGate) startResend(rank int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.resending[rank] {
		return false
	}
	g.resending[rank] = true
	return true
}

func (g *controlGate) endResend(rank int) {
	g.mu.Lock()
	delete(g.resending, rank)
	g.mu.Unlock()
}

// goRegister handles a register on its own goroutine when fewer than the
// bound wait already, else refuses it at once.
func (s *Service) goRegister(m *nats.Msg) {
	select {
	case s.gate.registers <- struct{}{}:
		if !s.tasks.start(func(ctx context.Context) {
			defer func() { <-s.gate.registers }()
			s.handleRegister(ctx, m)
		}) {
			<-s.gate.registers // the service is stopping: the trainer registers again
		}
	default:
		s.met.control.WithLabelValues(proto.CtlRegister, "busy").Inc()
		b, err := json.Marshal(proto.RegisterReply{Code: proto.RefusedFailed,
			Error: fmt.Sprintf("serve: register: %d registers already waiting, register again later", cap(s.gate.registers))})
		if err == nil {
			err = m.Respond(b)
		}
		if err != nil {
			s.log.Warn("register reply", "err", err)
		}
	}
}

// subscribe installs the control handlers on mmfeed.<job>.ctl.*.
func (s *Service) subscribe() ([]*nats.Subscription, error) {
	s.gate = newControlGate(s.cfg.Pipeline.Plan.DP * s.cfg.MP)
	handlers := map[string]nats.MsgHandler{
		proto.CtlRegister: s.goRegister, // may wait for a plan or a rewind
		proto.CtlFeedback: s.handleFeedback,
		proto.CtlDone:     s.handleDone,
		proto.CtlResend:   s.handleResend,
	}
	var subs []*nats.Subscription
	for kind, h := range handlers {
		subj, err := proto.ControlSubject(s.cfg.Job, kind)
		if err != nil {
			return subs, err
		}
		for _, sh := range []struct {
			subj string
			h    nats.MsgHandler
		}{{subj, h}, {subj + ".*.*", s.rankChecked(kind, h)}} {
			sub, err := s.nc.Subscribe(sh.subj, sh.h)
			if err != nil {
				for _, x := range subs {
					_ = x.Unsubscribe()
				}
				return nil, fmt.Errorf("serve: subscribe %s: %w", sh.subj, err)
			}
			subs = append(subs, sub)
		}
	}
	if err := s.nc.Flush(); err != nil {
		return subs, fmt.Errorf("serve: subscribe: %w", err)
	}
	return subs, nil
}

// rankChecked wraps the handler of a rank control subject
// (mmfeed.<job>.ctl.<kind>.<dp>.<mp>): a message whose payload names another
// rank than its subject is refused, so that subject permissions confine a
// credential to its own rank (docs/security.md).
func (s *Service) rankChecked(kind string, h nats.MsgHandler) nats.MsgHandler {
	return func(m *nats.Msg) {
		_, _, dp, mp, err := proto.ParseRankControlSubject(m.Subject)
		var r struct {
			DP *int `json:"dp_rank"`
			MP *int `json:"mp_rank"`
		}
		if err == nil {
			err = json.Unmarshal(m.Data, &r)
		}
		if err == nil && (r.DP == nil || r.MP == nil || *r.DP != dp || *r.MP != mp) {
			err = fmt.Errorf("serve: %s on %s names another rank: %w", kind, m.Subject, proto.ErrControl)
		}
		if err != nil {
			s.badControl(kind, err)
			return
		}
		h(m)
	}
}

// handleRegister answers a trainer rank's Register: the layout must match;
// the reply names the epoch's steps, plan hash, modality, stream, consumer
// and subject. A rank that needs a step the stream no longer holds (its
// checkpoint is older than its last ack) is republished from there with a
// new generation before the reply.
func (s *Service) handleRegister(ctx context.Context, m *nats.Msg) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RegisterWait+30*time.Second)
	defer cancel()
	reply := s.register(ctx, m.Data, replyPrefix(m.Reply))
	b, err := json.Marshal(reply)
	if err == nil {
		err = m.Respond(b)
	}
	if err != nil {
		s.log.Warn("register reply", "err", err)
	}
}

// register handles one Register; conn identifies the requester's connection
// (its reply inbox prefix).
func (s *Service) register(ctx context.Context, data []byte, conn string) proto.RegisterReply {
	fail := func(err error) proto.RegisterReply {
		s.met.control.WithLabelValues(proto.CtlRegister, "refused").Inc()
		if errors.Is(err, ErrEpochRange) {
			s.log.Info("register refused", "err", err) // how a client learns the job has no more epochs
		} else {
			s.log.Warn("register refused", "err", err)
		}
		l := s.cfg.layout()
		code := refusalCode(err)
		return proto.RegisterReply{OK: false, Error: err.Error(), Code: code,
			Retry: code == proto.RefusedNotReady || code == proto.RefusedFailed,
			DP:    l.DP, MP: l.MP, PP: l.PP, Placement: l.Placement}
	}
	var reg proto.Register
	if err := proto.DecodeControl(data, &reg); err != nil {
		return fail(err)
	}
	if err := reg.ValidateAgainst(s.cfg.Job, s.cfg.layout()); err != nil {
		return fail(err)
	}
	first, last := s.cfg.Pipeline.Plan.Epoch, s.cfg.lastEpoch()
	if reg.Epoch < first {
		return fail(fmt.Errorf("serve: register: epoch %d outside the job's epochs [%d, %d]: %w", reg.Epoch, first, last, proto.ErrControl))
	}
	if reg.Epoch > last {
		return fail(fmt.Errorf("serve: register: epoch %d outside the job's epochs [%d, %d]: %w", reg.Epoch, first, last, ErrEpochRange))
	}
	if err := s.decideResize(ctx, reg.Epoch, reg.ResumeStep); err != nil {
		return fail(err)
	}
	info, err := s.epochs.waitInfo(ctx, reg.Epoch, s.cfg.RegisterWait)
	if err != nil {
		return fail(err)
	}
	if reg.ResumeStep > info.Steps {
		return fail(fmt.Errorf("serve: register: resume_step %d > the epoch's %d steps: %w", reg.ResumeStep, info.Steps, proto.ErrControl))
	}
	rank := reg.DPRank*s.cfg.MP + reg.MPRank
	need := s.epochs.norm(pos{reg.Epoch, reg.ResumeStep})
	if err := s.resumeRank(ctx, rank, need, conn); err != nil {
		return fail(err)
	}
	mod, _ := proto.ModalityFor(reg.Placement, reg.MP, reg.MPRank)
	subj, _ := proto.BatchSubject(s.cfg.Job, reg.DPRank, reg.MPRank)
	s.met.control.WithLabelValues(proto.CtlRegister, "ok").Inc()
	s.log.Info("rank registered", "dp", reg.DPRank, "mp", reg.MPRank, "epoch", reg.Epoch, "resume_step", reg.ResumeStep)
	l := s.cfg.layout()
	rep := proto.RegisterReply{OK: true, PlanHash: info.PlanHash, Steps: info.Steps, MicroBatches: info.MicroBatches,
		DP: l.DP, MP: l.MP, PP: l.PP, Placement: l.Placement,
		Epoch: reg.Epoch, Pack: s.cfg.Pipeline.Plan.Pack, VocabSize: info.VocabSize, Modality: mod, Stream: proto.StreamName(s.cfg.Job),
		Consumer: proto.ConsumerName(s.cfg.Job, reg.DPRank, reg.MPRank), Subject: subj}
	s.dataPlaneReply(&rep, reg.DPRank, reg.MPRank)
	return rep
}

// refusalCode classifies a register refusal for the trainer: retry (the
// epoch is still being planned, or the service failed just now), stop (the
// job has no such epoch: the end of the data), or give up (the register is
// wrong).
func refusalCode(err error) string {
	switch {
	case errors.Is(err, ErrNotReady):
		return proto.RefusedNotReady
	case errors.Is(err, ErrEpochRange):
		return proto.RefusedEnd
	case errors.Is(err, proto.ErrControl), errors.Is(err, proto.ErrLayout):
		return proto.RefusedInvalid
	}
	return proto.RefusedFailed
}

// resumeRank sets where rank's trainer continues. When the stream no longer
// holds everything from need on (the trainer acknowledged batches its
// checkpoint lacks), the rank is rewound to need and republished.
func (s *Service) resumeRank(ctx context.Context, rank int, need pos, conn string) error {
	dp, mp := rank/s.cfg.MP, rank%s.cfg.MP
	if same := s.ranks.swapConn(rank, conn); !same && !s.cfg.core() { // a new trainer incarnation: chunks the old one held come back at once
		if err := s.resetConsumer(ctx, dp, mp); err != nil {
			return err
		}
	}
	// The cursor first: what is published after this is still stored when
	// the stream is looked at, so either the stream's first batch or the
	// cursor bounds what the rank can still receive.
	avail := s.ranks.get(rank).cursor
	h, stored, err := s.firstHeld(ctx, rank)
	if err != nil {
		return err
	}
	if stored {
		avail = pos{h.Epoch, h.Step}
		if h.MicroBatch > 0 || h.Index > 0 { // the step's first chunks were acknowledged
			avail.Step++
		}
	}
	if need.less(avail) {
		done := make(chan error, 1)
		if err := s.requestRewind(ctx, rewindReq{rank: rank, to: need, reason: "register", done: done}); err != nil {
			return err
		}
		select {
		case err := <-done:
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.setNext(ctx, rank, need, true)
	return nil
}

// replyPrefix returns a request's reply subject without its last token: the
// connection's inbox prefix with nats.go and nats-py muxed requests, so a
// trainer registering again for its next epoch on the same connection is
// recognised (and its unacknowledged chunks left alone).
func replyPrefix(reply string) string {
	if i := strings.LastIndexByte(reply, '.'); i > 0 {
		return reply[:i]
	}
	return ""
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

// setNext records the first step rank's trainer still needs (in memory and
// as the KV rank step; with force it may move backwards: a register) and
// wakes the publisher when it moved.
func (s *Service) setNext(ctx context.Context, rank int, next pos, force bool) {
	moved, err := s.ranks.setNext(ctx, rank, next, force)
	if err != nil {
		s.log.Warn("kv rank step", "dp", rank/s.cfg.MP, "mp", rank%s.cfg.MP, "err", err)
	}
	if moved {
		s.publisher.poke()
	}
}

// checkRank validates a control message's job and ranks.
func (s *Service) checkRank(job string, dp, mp int) (int, error) {
	if job != s.cfg.Job {
		return 0, fmt.Errorf("serve: control message for job %q, this service runs %q: %w", job, s.cfg.Job, proto.ErrControl)
	}
	if dp >= s.cfg.Pipeline.Plan.DP || mp >= s.cfg.MP {
		return 0, fmt.Errorf("serve: control message for rank dp=%d mp=%d outside dp=%d mp=%d: %w", dp, mp, s.cfg.Pipeline.Plan.DP, s.cfg.MP, proto.ErrLayout)
	}
	return dp*s.cfg.MP + mp, nil
}

// handleFeedback records a rank's measured step: its position, the
// Prometheus timings, the live report and a calibration observation.
func (s *Service) handleFeedback(m *nats.Msg) {
	var fb proto.Feedback
	err := proto.DecodeControl(m.Data, &fb)
	rank := 0
	if err == nil {
		rank, err = s.checkRank(fb.Job, fb.DPRank, fb.MPRank)
	}
	if err != nil {
		s.badControl(proto.CtlFeedback, err)
		return
	}
	s.met.control.WithLabelValues(proto.CtlFeedback, "ok").Inc()
	s.met.feedback(fb)
	if f, ok := s.epochs.features(fb.Epoch, fb.Step, fb.DPRank); ok {
		s.cal.add(fb, f)
	}
	s.live.measured(fb)
	s.advanceAcked(s.tasks.context(), rank, pos{fb.Epoch, fb.Step + 1}, 0)
}

// unacked returns the first step rank has not acknowledged: the step of the
// first chunk its subject still stores (work-queue retention drops what is
// acknowledged), or, when nothing is stored, the rank's publish cursor
// (everything before it was published and acknowledged). The cursor is read
// first: what is published after that is still stored when the stream is
// looked at.
func (s *Service) unacked(ctx context.Context, rank int) (pos, error) {
	bound := s.ranks.get(rank).cursor
	h, stored, err := s.firstHeld(ctx, rank)
	if err != nil {
		return pos{}, err
	}
	if stored {
		bound = pos{h.Epoch, h.Step}
	}
	return s.epochs.norm(bound), nil
}

// advanceAcked moves rank's next needed step forward to want, but never past
// what the rank acknowledged: a message alone (a forged or early feedback or
// done) cannot make the service treat unacknowledged batches as consumed, or
// end the job. When want is ahead, it polls for up to wait for the
// acknowledgements to land (a trainer may ack asynchronously just before it
// reports), then moves as far as they go.
func (s *Service) advanceAcked(ctx context.Context, rank int, want pos, wait time.Duration) {
	ahead := s.ranks.get(rank).next.less(s.epochs.norm(want))
	if !ahead {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, wait+10*time.Second)
	defer cancel()
	deadline := time.Now().Add(wait)
	for {
		bound, err := s.unacked(ctx, rank)
		if err != nil {
			s.log.Warn("acknowledged position", "rank", rank, "err", err)
			return
		}
		want = s.epochs.norm(want)
		if !bound.less(want) {
			s.setNext(ctx, rank, want, false)
			return
		}
		if time.Now().After(deadline) {
			if wait > 0 {
				s.met.control.WithLabelValues(proto.CtlDone, "unacknowledged").Inc()
				s.log.Warn("rank reports past what it acknowledged; kept at its first unacknowledged step",
					"rank", rank, "reported_epoch", want.Epoch, "reported_step", want.Step, "unacked_epoch", bound.Epoch, "unacked_step", bound.Step)
			}
			s.setNext(ctx, rank, bound, false)
			return
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
}

// handleDone records that a rank completed an epoch.
func (s *Service) handleDone(m *nats.Msg) {
	var d proto.Done
	err := proto.DecodeControl(m.Data, &d)
	rank := 0
	if err == nil {
		rank, err = s.checkRank(d.Job, d.DPRank, d.MPRank)
	}
	if err != nil {
		s.badControl(proto.CtlDone, err)
		return
	}
	s.met.control.WithLabelValues(proto.CtlDone, "ok").Inc()
	s.log.Info("rank done", "dp", d.DPRank, "mp", d.MPRank, "epoch", d.Epoch, "steps", d.Steps)
	s.tasks.start(func(ctx context.Context) { s.advanceAcked(ctx, rank, pos{d.Epoch + 1, 0}, doneAckWait) })
}

// doneAckWait bounds how long a done waits for the rank's last
// acknowledgements to reach the stream before it counts only what was
// acknowledged.
var doneAckWait = 10 * time.Second // a variable so tests can shorten it

// handleResend republishes a rank from the failed batch's step with a new
// generation.
func (s *Service) handleResend(m *nats.Msg) {
	var r proto.Resend
	err := proto.DecodeControl(m.Data, &r)
	rank := 0
	if err == nil {
		rank, err = s.checkRank(r.Job, r.DPRank, r.MPRank)
	}
	if err != nil {
		s.badControl(proto.CtlResend, err)
		answerResend(m, err)
		return
	}
	// Received: a client that asked (request-reply) stops retrying.
	answerResend(m, nil)
	if !s.gate.startResend(rank) { // the rewind in flight replays this step too
		s.met.control.WithLabelValues(proto.CtlResend, "merged").Inc()
		return
	}
	s.met.control.WithLabelValues(proto.CtlResend, "ok").Inc()
	s.log.Warn("resend requested", "dp", r.DPRank, "mp", r.MPRank, "epoch", r.Epoch, "step", r.Step, "micro_batch", r.MicroBatch, "reason", r.Reason)
	started := s.tasks.start(func(ctx context.Context) {
		defer s.gate.endResend(rank)
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		to, err := s.resendFrom(ctx, rank, pos{r.Epoch, r.Step})
		if err == nil {
			err = s.requestRewind(ctx, rewindReq{rank: rank, to: to, reason: "resend: " + r.Reason})
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			s.log.Warn("resend", "err", err)
		}
	})
	if !started {
		s.gate.endResend(rank)
	}
}

// answerResend replies to a resend sent as a request: {"ok": true} once the
// service has it (the rewind follows asynchronously), or the refusal. A
// fire-and-forget resend (no reply subject) gets nothing.
func answerResend(m *nats.Msg, refused error) {
	if m.Reply == "" {
		return
	}
	rep := proto.ResendReply{OK: refused == nil}
	if refused != nil {
		rep.Error = refused.Error()
	}
	b, _ := json.Marshal(rep)
	_ = m.Respond(b)
}

// resendFrom returns where a resend of asked moves rank: its first
// unacknowledged step. The rewind purges the rank's subject, so starting any
// later would drop stored, unacknowledged batches (a forged resend for step 7
// purged steps 0–6 for good); a resend of a step the rank already
// acknowledged is refused (it would deliver those batches twice).
func (s *Service) resendFrom(ctx context.Context, rank int, asked pos) (pos, error) {
	bound, err := s.unacked(ctx, rank)
	if err != nil {
		return pos{}, err
	}
	if asked.less(bound) {
		return pos{}, fmt.Errorf("serve: resend of epoch %d step %d, which rank %d acknowledged (first unacknowledged: epoch %d step %d): %w",
			asked.Epoch, asked.Step, rank, bound.Epoch, bound.Step, proto.ErrControl)
	}
	return bound, nil
}

func (s *Service) badControl(kind string, err error) {
	s.met.control.WithLabelValues(kind, "refused").Inc()
	s.log.Warn("bad control message", "kind", kind, "err", err)
}
