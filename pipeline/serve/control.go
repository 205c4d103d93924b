package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// control answers the trainers' control messages on mmfeed.<job>.ctl.*:
// register (where a rank starts, waiting for its epoch's plan or a rewind),
// feedback (measured steps: metrics, the live report, calibration), done and
// resend. It acts through the parts it is given and never ends a job or
// drops a batch on a message alone: a rank's position only moves forward to
// what the rank acknowledged (the data plane's first held batch, or the
// publish cursor), and a resend only moves a rank back to what it has not
// acknowledged. Every goroutine it starts runs under tasks (Run's context),
// bounded by gate. Its handlers are safe for concurrent use; its state is
// the gate's, everything else is owned by the parts (doc.go, "Ownership
// and concurrency").
type control struct {
	cfg      Config
	log      *slog.Logger
	met      *metrics
	ranks    *deliver.Ranks
	epochs   *epochs.Book
	cal      *calibrator
	live     *live
	tasks    *tasks
	gate     *controlGate
	poke     func() // wakes the publisher when a rank's next step moved
	plane    controlPlane
	delivery delivery
	replies  *replyGuard // answers only the requester's own inbox (replyscope.go)
	rlog     *rateLog    // refusals: at most one line per kind a second
}

// controlPlane is what control asks of the data plane (dataPlane, plane.go:
// the core outbox or the JetStream stream).
type controlPlane interface {
	// firstHeld is the first chunk the data plane still holds for rank.
	firstHeld(ctx context.Context, rank int) (proto.ChunkHeader, bool, error)
	// fillRegisterReply fills the data plane's part of a register reply.
	fillRegisterReply(rep *proto.RegisterReply, dp, mp int)
	// trainerReplaced tells the plane that a new incarnation of rank's
	// trainer registered: what the old one was delivered and did not
	// acknowledge must come to the new one at once.
	trainerReplaced(ctx context.Context, rank int) error
}

// delivery is what control asks of the publish loop (rewinds) and of the
// resize decision: the Service implements it.
type delivery interface {
	// requestRewind republishes a rank from a step with the next generation.
	requestRewind(ctx context.Context, req rewindReq) error
	// decideResize accepts or refuses a dp change when a rank registers.
	decideResize(ctx context.Context, epoch, step int) error
}

func newControl(s *Service) *control {
	if s.replies == nil {
		s.replies = &replyGuard{job: s.cfg.Job, dp: s.cfg.Pipeline.Plan.DP, mp: s.cfg.MP, met: s.met, log: newRateLog(s.log)}
	}
	return &control{cfg: s.cfg, log: s.log, met: s.met, ranks: s.ranks, epochs: s.epochs, cal: s.cal, live: s.live,
		tasks: &s.tasks, gate: newControlGate(s.cfg.Pipeline.Plan.DP * s.cfg.MP), poke: s.publisher.poke, plane: s.plane, delivery: s,
		replies: s.replies, rlog: s.replies.log}
}

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
func (c *control) goRegister(m *nats.Msg) {
	select {
	case c.gate.registers <- struct{}{}:
		if !c.tasks.start(func(ctx context.Context) {
			defer func() { <-c.gate.registers }()
			c.handleRegister(ctx, m)
		}) {
			<-c.gate.registers // the service is stopping: the trainer registers again
		}
	default:
		c.met.control.WithLabelValues(proto.CtlRegister, "busy").Inc()
		b, err := json.Marshal(proto.RegisterReply{Code: proto.RefusedFailed,
			Error: fmt.Sprintf("serve: register: %d registers already waiting, register again later", cap(c.gate.registers))})
		if err == nil {
			err = m.Respond(b)
		}
		if err != nil {
			c.rlog.warn("register:busy", "register reply", "err", err)
		}
	}
}

// subscribe installs the control handlers on mmfeed.<job>.ctl.* of nc.
func (c *control) subscribe(nc *nats.Conn) ([]*nats.Subscription, error) {
	handlers := map[string]nats.MsgHandler{
		proto.CtlRegister: c.goRegister, // may wait for a plan or a rewind
		proto.CtlFeedback: c.handleFeedback,
		proto.CtlDone:     c.handleDone,
		proto.CtlResend:   c.handleResend,
	}
	var subs []*nats.Subscription
	for kind, h := range handlers {
		subj, err := proto.ControlSubject(c.cfg.Job, kind)
		if err != nil {
			return subs, err
		}
		for _, sh := range []struct {
			subj string
			h    nats.MsgHandler
		}{{subj, h}, {subj + ".*.*", c.rankChecked(kind, h)}} {
			sub, err := nc.Subscribe(sh.subj, c.replyChecked(kind, sh.h))
			if err != nil {
				for _, x := range subs {
					_ = x.Unsubscribe()
				}
				return nil, fmt.Errorf("serve: subscribe %s: %w", sh.subj, err)
			}
			subs = append(subs, sub)
		}
	}
	if err := nc.Flush(); err != nil {
		return subs, fmt.Errorf("serve: subscribe: %w", err)
	}
	return subs, nil
}

// rankChecked wraps the handler of a rank control subject
// (mmfeed.<job>.ctl.<kind>.<dp>.<mp>): a message whose payload names another
// rank than its subject is refused, so that subject permissions confine a
// credential to its own rank (docs/security.md).
func (c *control) rankChecked(kind string, h nats.MsgHandler) nats.MsgHandler {
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
			c.badControl(kind, err)
			return
		}
		h(m)
	}
}

// replyChecked wraps a control handler: a message whose reply subject is
// outside the requester's own inbox (replyGuard) is dropped before it does
// anything.
func (c *control) replyChecked(kind string, h nats.MsgHandler) nats.MsgHandler {
	return func(m *nats.Msg) {
		if c.replies.allow(kind, m, c.replies.ownOf(m.Subject, m.Data)...) {
			h(m)
		}
	}
}

// handleRegister answers a trainer rank's Register: the layout must match;
// the reply names the epoch's steps, plan hash, modality, stream, consumer
// and subject. A rank that needs a step the stream no longer holds (its
// checkpoint is older than its last ack) is republished from there with a
// new generation before the reply.
func (c *control) handleRegister(ctx context.Context, m *nats.Msg) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RegisterWait+30*time.Second)
	defer cancel()
	reply := c.register(ctx, m.Data, natsenv.ReplyPrefix(m.Reply))
	b, err := json.Marshal(reply)
	if err == nil {
		err = m.Respond(b)
	}
	if err != nil {
		c.log.Warn("register reply", "err", err)
	}
}

// register handles one Register; conn identifies the requester's connection
// (its reply inbox prefix).
func (c *control) register(ctx context.Context, data []byte, conn string) proto.RegisterReply {
	fail := func(err error) proto.RegisterReply {
		c.met.control.WithLabelValues(proto.CtlRegister, "refused").Inc()
		if errors.Is(err, ErrEpochRange) {
			c.log.Debug("register refused", "err", err) // how a client learns the job has no more epochs: every clean end
		} else {
			c.rlog.warn("register:refused", "register refused", "err", err)
		}
		l := c.cfg.layout()
		code := refusalCode(err)
		return proto.RegisterReply{OK: false, Error: err.Error(), Code: code,
			Retry: code == proto.RefusedNotReady || code == proto.RefusedFailed,
			DP:    l.DP, MP: l.MP, PP: l.PP, Placement: l.Placement}
	}
	var reg proto.Register
	if err := proto.DecodeControl(data, &reg); err != nil {
		return fail(err)
	}
	if err := reg.ValidateAgainst(c.cfg.Job, c.cfg.layout()); err != nil {
		return fail(err)
	}
	first, last := c.cfg.Pipeline.Plan.Epoch, c.cfg.lastEpoch()
	if reg.Epoch < first {
		return fail(fmt.Errorf("serve: register: epoch %d outside the job's epochs [%d, %d]: %w", reg.Epoch, first, last, proto.ErrControl))
	}
	if reg.Epoch > last {
		return fail(fmt.Errorf("serve: register: epoch %d outside the job's epochs [%d, %d]: %w", reg.Epoch, first, last, ErrEpochRange))
	}
	if err := c.delivery.decideResize(ctx, reg.Epoch, reg.ResumeStep); err != nil {
		return fail(err)
	}
	info, err := c.epochs.WaitInfo(ctx, reg.Epoch, c.cfg.RegisterWait)
	if err != nil {
		return fail(err)
	}
	if reg.ResumeStep > info.Steps {
		return fail(fmt.Errorf("serve: register: resume_step %d > the epoch's %d steps: %w", reg.ResumeStep, info.Steps, proto.ErrControl))
	}
	rank := reg.DPRank*c.cfg.MP + reg.MPRank
	need := c.epochs.Norm(pos{Epoch: reg.Epoch, Step: reg.ResumeStep})
	if err := c.resumeRank(ctx, rank, need, conn); err != nil {
		return fail(err)
	}
	mod, _ := proto.ModalityFor(reg.Placement, reg.MP, reg.MPRank)
	subj, _ := proto.BatchSubject(c.cfg.Job, reg.DPRank, reg.MPRank)
	c.met.control.WithLabelValues(proto.CtlRegister, "ok").Inc()
	c.log.Info("rank registered", "dp", reg.DPRank, "mp", reg.MPRank, "epoch", reg.Epoch, "resume_step", reg.ResumeStep)
	l := c.cfg.layout()
	rep := proto.RegisterReply{OK: true, PlanHash: info.PlanHash, Steps: info.Steps, MicroBatches: info.MicroBatches,
		DP: l.DP, MP: l.MP, PP: l.PP, Placement: l.Placement,
		Epoch: reg.Epoch, Pack: c.cfg.Pipeline.Plan.Pack, VocabSize: info.VocabSize, Modality: mod, Stream: proto.StreamName(c.cfg.Job),
		Consumer: proto.ConsumerName(c.cfg.Job, reg.DPRank, reg.MPRank), Subject: subj, Generation: c.ranks.Gen(rank)}
	c.plane.fillRegisterReply(&rep, reg.DPRank, reg.MPRank)
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
func (c *control) resumeRank(ctx context.Context, rank int, need pos, conn string) error {
	if same := c.ranks.SwapConn(rank, conn); !same { // a new trainer incarnation: chunks the old one held come back at once
		if err := c.plane.trainerReplaced(ctx, rank); err != nil {
			return err
		}
	}
	// The cursor first: what is published after this is still stored when
	// the stream is looked at, so either the stream's first batch or the
	// cursor bounds what the rank can still receive.
	avail := c.ranks.Cursor(rank)
	h, stored, err := c.plane.firstHeld(ctx, rank)
	if err != nil {
		return err
	}
	if stored {
		avail = pos{Epoch: h.Epoch, Step: h.Step}
		if h.MicroBatch > 0 || h.Index > 0 { // the step's first chunks were acknowledged
			avail.Step++
		}
	}
	if need.Less(avail) {
		done := make(chan error, 1)
		if err := c.delivery.requestRewind(ctx, rewindReq{rank: rank, to: need, reason: "register", done: done}); err != nil {
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
	c.setNext(rank, need, true)
	return nil
}

// setNext records the first step rank's trainer still needs (in memory and
// in KeyPositions; with force it may move backwards: a register) and wakes
// the publisher when it moved.
func (c *control) setNext(rank int, next pos, force bool) {
	if c.ranks.SetNext(rank, next, force) {
		c.poke()
	}
}

// checkRank validates a control message's job and ranks.
func (c *control) checkRank(job string, dp, mp int) (int, error) {
	if job != c.cfg.Job {
		return 0, fmt.Errorf("serve: control message for job %q, this service runs %q: %w", job, c.cfg.Job, proto.ErrControl)
	}
	if dp >= c.cfg.Pipeline.Plan.DP || mp >= c.cfg.MP {
		return 0, fmt.Errorf("serve: control message for rank dp=%d mp=%d outside dp=%d mp=%d: %w", dp, mp, c.cfg.Pipeline.Plan.DP, c.cfg.MP, proto.ErrLayout)
	}
	return dp*c.cfg.MP + mp, nil
}

// handleFeedback records a rank's measured step: its position, the
// Prometheus timings, the live report and a calibration observation.
func (c *control) handleFeedback(m *nats.Msg) {
	var fb proto.Feedback
	err := proto.DecodeControl(m.Data, &fb)
	rank := 0
	if err == nil {
		rank, err = c.checkRank(fb.Job, fb.DPRank, fb.MPRank)
	}
	if err != nil {
		c.badControl(proto.CtlFeedback, err)
		return
	}
	c.met.control.WithLabelValues(proto.CtlFeedback, "ok").Inc()
	c.met.feedback(fb)
	if f, ok := c.epochs.Features(fb.Epoch, fb.Step, fb.DPRank); ok {
		c.cal.add(fb, f)
	}
	c.live.measured(fb)
	c.advanceAcked(c.tasks.context(), rank, pos{Epoch: fb.Epoch, Step: fb.Step + 1}, 0)
}

// unacked returns the first step rank has not acknowledged: the step of the
// first chunk its subject still stores (work-queue retention drops what is
// acknowledged), or, when nothing is stored, the rank's publish cursor
// (everything before it was published and acknowledged). The cursor is read
// first: what is published after that is still stored when the stream is
// looked at.
func (c *control) unacked(ctx context.Context, rank int) (pos, error) {
	bound := c.ranks.Cursor(rank)
	h, stored, err := c.plane.firstHeld(ctx, rank)
	if err != nil {
		return pos{}, err
	}
	if stored {
		bound = pos{Epoch: h.Epoch, Step: h.Step}
	}
	return c.epochs.Norm(bound), nil
}

// advanceAcked moves rank's next needed step forward to want, but never past
// what the rank acknowledged: a message alone (a forged or early feedback or
// done) cannot make the service treat unacknowledged batches as consumed, or
// end the job. When want is ahead, it polls for up to wait for the
// acknowledgements to land (a trainer may ack asynchronously just before it
// reports), then moves as far as they go.
func (c *control) advanceAcked(ctx context.Context, rank int, want pos, wait time.Duration) {
	ahead := c.ranks.Next(rank).Less(c.epochs.Norm(want))
	if !ahead {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, wait+10*time.Second)
	defer cancel()
	deadline := time.Now().Add(wait)
	for {
		bound, err := c.unacked(ctx, rank)
		if err != nil {
			c.log.Warn("acknowledged position", "rank", rank, "err", err)
			return
		}
		want = c.epochs.Norm(want)
		if !bound.Less(want) {
			c.setNext(rank, want, false)
			return
		}
		if time.Now().After(deadline) {
			if wait > 0 {
				c.met.control.WithLabelValues(proto.CtlDone, "unacknowledged").Inc()
				c.rlog.warn("done:unacknowledged", "rank reports past what it acknowledged; kept at its first unacknowledged step",
					"rank", rank, "reported_epoch", want.Epoch, "reported_step", want.Step, "unacked_epoch", bound.Epoch, "unacked_step", bound.Step)
			}
			c.setNext(rank, bound, false)
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
func (c *control) handleDone(m *nats.Msg) {
	var d proto.Done
	err := proto.DecodeControl(m.Data, &d)
	rank := 0
	if err == nil {
		rank, err = c.checkRank(d.Job, d.DPRank, d.MPRank)
	}
	if err != nil {
		c.badControl(proto.CtlDone, err)
		return
	}
	c.met.control.WithLabelValues(proto.CtlDone, "ok").Inc()
	c.log.Info("rank done", "dp", d.DPRank, "mp", d.MPRank, "epoch", d.Epoch, "steps", d.Steps)
	c.tasks.start(func(ctx context.Context) { c.advanceAcked(ctx, rank, pos{Epoch: d.Epoch + 1, Step: 0}, doneAckWait) })
}

// doneAckWait bounds how long a done waits for the rank's last
// acknowledgements to reach the stream before it counts only what was
// acknowledged.
var doneAckWait = 10 * time.Second // a variable so tests can shorten it

// handleResend republishes a rank from the failed batch's step with a new
// generation.
func (c *control) handleResend(m *nats.Msg) {
	var r proto.Resend
	err := proto.DecodeControl(m.Data, &r)
	rank := 0
	if err == nil {
		rank, err = c.checkRank(r.Job, r.DPRank, r.MPRank)
	}
	if err != nil {
		c.badControl(proto.CtlResend, err)
		answerResend(m, err)
		return
	}
	// Received: a client that asked (request-reply) stops retrying.
	answerResend(m, nil)
	if !c.gate.startResend(rank) { // the rewind in flight replays this step too
		c.met.control.WithLabelValues(proto.CtlResend, "merged").Inc()
		return
	}
	c.met.control.WithLabelValues(proto.CtlResend, "ok").Inc()
	c.rlog.warn("resend:ok", "resend requested", "dp", r.DPRank, "mp", r.MPRank, "epoch", r.Epoch, "step", r.Step, "micro_batch", r.MicroBatch, "reason", r.Reason)
	started := c.tasks.start(func(ctx context.Context) {
		defer c.gate.endResend(rank)
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		to, err := c.resendFrom(ctx, rank, pos{Epoch: r.Epoch, Step: r.Step})
		if err == nil {
			err = c.delivery.requestRewind(ctx, rewindReq{rank: rank, to: to, reason: "resend: " + r.Reason})
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			c.log.Warn("resend", "err", err)
		}
	})
	if !started {
		c.gate.endResend(rank)
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
func (c *control) resendFrom(ctx context.Context, rank int, asked pos) (pos, error) {
	bound, err := c.unacked(ctx, rank)
	if err != nil {
		return pos{}, err
	}
	if asked.Less(bound) {
		return pos{}, fmt.Errorf("serve: resend of epoch %d step %d, which rank %d acknowledged (first unacknowledged: epoch %d step %d): %w",
			asked.Epoch, asked.Step, rank, bound.Epoch, bound.Step, proto.ErrControl)
	}
	return bound, nil
}

func (c *control) badControl(kind string, err error) {
	c.met.control.WithLabelValues(kind, "refused").Inc()
	c.rlog.warn("control:"+kind, "bad control message", "kind", kind, "err", err)
}
