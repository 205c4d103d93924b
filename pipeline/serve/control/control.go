package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// Control answers the trainers' control messages on mmfeed.<job>.ctl.*:
// register (where a rank starts, waiting for its epoch's plan or a rewind),
// feedback (measured steps: metrics, the live report, calibration), done and
// resend. It acts through the parts it is given and never ends a job or
// drops a batch on a message alone: a rank's position only moves forward to
// what the rank acknowledged (the data plane's first held batch, or the
// publish cursor), and a resend only moves a rank back to what it has not
// acknowledged. Every goroutine it starts runs under its Tasks (Run's
// context), bounded by gate. Its handlers are safe for concurrent use; its
// state is the gate's, everything else is owned by the parts.
type Control struct {
	cfg      Config
	log      *slog.Logger
	met      Metrics
	ranks    Ranks
	epochs   Epochs
	cal      Calibrator
	live     Report
	tasks    Tasks
	gate     *controlGate
	plane    Plane
	delivery Delivery
	replies  *Guard   // answers only the requester's own inbox (replyscope.go)
	rlog     *RateLog // refusals: at most one line per kind a second
}

// New returns the control handlers of the job cfg names, acting
// through p.
func New(cfg Config, p Parts) *Control {
	return &Control{cfg: cfg, log: p.Log, met: p.Metrics, ranks: p.Ranks, epochs: p.Epochs, cal: p.Calibrator, live: p.Report,
		tasks: p.Tasks, gate: newControlGate(cfg.Layout.DP * cfg.Layout.MP), plane: p.Plane, delivery: p.Delivery,
		replies: p.Replies, rlog: p.RateLog}
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

// MaxWaitingRegisters is the registers one service lets wait at once: twice
// the world size (every rank registering for this and the next epoch) plus
// slack; more are refused with code "failed" (register again later).
func MaxWaitingRegisters(world int) int { return 2*world + 8 }

func newControlGate(world int) *controlGate {
	return &controlGate{registers: make(chan struct{}, MaxWaitingRegisters(world)), resending: map[int]bool{}}
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
func (c *Control) goRegister(m *nats.Msg) {
	select {
	case c.gate.registers <- struct{}{}:
		if !c.tasks.Start(func(ctx context.Context) {
			defer func() { <-c.gate.registers }()
			c.handleRegister(ctx, m)
		}) {
			<-c.gate.registers // the service is stopping: the trainer registers again
		}
	default:
		c.met.Control(proto.CtlRegister, "busy")
		b, err := json.Marshal(proto.RegisterReply{Code: proto.RefusedFailed,
			Error: fmt.Sprintf("serve: register: %d registers already waiting, register again later", cap(c.gate.registers))})
		if err == nil {
			err = m.Respond(b)
		}
		if err != nil {
			c.rlog.Warn("register:busy", "register reply", "err", err)
		}
	}
}

// Subscribe installs the control handlers on mmfeed.<job>.ctl.* of nc.
func (c *Control) Subscribe(nc *nats.Conn) ([]*nats.Subscription, error) {
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
func (c *Control) rankChecked(kind string, h nats.MsgHandler) nats.MsgHandler {
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
			c.BadControl(kind, err)
			return
		}
		h(m)
	}
}

// replyChecked wraps a control handler: a message whose reply subject is
// outside the requester's own inbox (replyGuard) is dropped before it does
// anything.
func (c *Control) replyChecked(kind string, h nats.MsgHandler) nats.MsgHandler {
	return func(m *nats.Msg) {
		if c.replies.Allow(kind, m, c.replies.ownOf(m.Subject, m.Data)...) {
			h(m)
		}
	}
}

// handleRegister answers a trainer rank's Register: the layout must match;
// the reply names the epoch's steps, plan hash, modality, stream, consumer
// and subject. A rank that needs a step the stream no longer holds (its
// checkpoint is older than its last ack) is republished from there with a
// new generation before the reply.
func (c *Control) handleRegister(ctx context.Context, m *nats.Msg) {
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
func (c *Control) register(ctx context.Context, data []byte, conn string) proto.RegisterReply {
	fail := func(err error) proto.RegisterReply {
		c.met.Control(proto.CtlRegister, "refused")
		if errors.Is(err, ErrEpochRange) {
			c.log.Debug("register refused", "err", err) // how a client learns the job has no more epochs: every clean end
		} else {
			c.rlog.Warn("register:refused", "register refused", "err", err)
		}
		l := c.cfg.Layout
		code := refusalCode(err)
		return proto.RegisterReply{OK: false, Error: err.Error(), Code: code,
			Retry: code == proto.RefusedNotReady || code == proto.RefusedFailed,
			DP:    l.DP, MP: l.MP, PP: l.PP, Placement: l.Placement}
	}
	var reg proto.Register
	if err := proto.DecodeControl(data, &reg); err != nil {
		return fail(err)
	}
	if err := reg.ValidateAgainst(c.cfg.Job, c.cfg.Layout); err != nil {
		return fail(err)
	}
	first, last := c.cfg.FirstEpoch, c.cfg.LastEpoch
	if reg.Epoch < first {
		return fail(fmt.Errorf("serve: register: epoch %d outside the job's epochs [%d, %d]: %w", reg.Epoch, first, last, proto.ErrControl))
	}
	if reg.Epoch > last {
		return fail(fmt.Errorf("serve: register: epoch %d outside the job's epochs [%d, %d]: %w", reg.Epoch, first, last, ErrEpochRange))
	}
	if err := c.delivery.DecideResize(ctx, reg.Epoch, reg.ResumeStep); err != nil {
		return fail(err)
	}
	info, err := c.epochs.WaitInfo(ctx, reg.Epoch, c.cfg.RegisterWait)
	if err != nil {
		return fail(err)
	}
	if reg.ResumeStep > info.Steps {
		return fail(fmt.Errorf("serve: register: resume_step %d > the epoch's %d steps: %w", reg.ResumeStep, info.Steps, proto.ErrControl))
	}
	rank := reg.DPRank*c.cfg.Layout.MP + reg.MPRank
	need := c.epochs.Norm(proto.Pos{Epoch: reg.Epoch, Step: reg.ResumeStep})
	if err := c.resumeRank(ctx, rank, need, conn); err != nil {
		return fail(err)
	}
	mod, _ := proto.ModalityFor(reg.Placement, reg.MP, reg.MPRank)
	subj, _ := proto.BatchSubject(c.cfg.Job, reg.DPRank, reg.MPRank)
	c.met.Control(proto.CtlRegister, "ok")
	c.log.Info("rank registered", "dp", reg.DPRank, "mp", reg.MPRank, "epoch", reg.Epoch, "resume_step", reg.ResumeStep)
	l := c.cfg.Layout
	rep := proto.RegisterReply{OK: true, PlanHash: info.PlanHash, Steps: info.Steps, MicroBatches: info.MicroBatches,
		DP: l.DP, MP: l.MP, PP: l.PP, Placement: l.Placement,
		Epoch: reg.Epoch, Pack: c.cfg.Pack, VocabSize: info.VocabSize, Modality: mod, Stream: proto.StreamName(c.cfg.Job),
		Consumer: proto.ConsumerName(c.cfg.Job, reg.DPRank, reg.MPRank), Subject: subj, Generation: c.ranks.Gen(rank)}
	c.plane.FillRegisterReply(&rep, reg.DPRank, reg.MPRank)
	return rep
}

// ErrEpochRange: a trainer asked for an epoch outside the job's epochs
// (serve.ErrEpochRange).
var ErrEpochRange = errors.New("epoch outside the job")

// refusalCode classifies a register refusal for the trainer: retry (the
// epoch is still being planned, or the service failed just now), stop (the
// job has no such epoch: the end of the data), or give up (the register is
// wrong).
func refusalCode(err error) string {
	switch {
	case errors.Is(err, epochs.ErrNotReady):
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
func (c *Control) resumeRank(ctx context.Context, rank int, need proto.Pos, conn string) error {
	if same := c.ranks.SwapConn(rank, conn); !same { // a new trainer incarnation: chunks the old one held come back at once
		if err := c.plane.TrainerReplaced(ctx, rank); err != nil {
			return err
		}
	}
	// The cursor first: what is published after this is still stored when
	// the stream is looked at, so either the stream's first batch or the
	// cursor bounds what the rank can still receive.
	avail := c.ranks.Cursor(rank)
	h, stored, err := c.plane.FirstHeld(ctx, rank)
	if err != nil {
		return err
	}
	if stored {
		avail = proto.Pos{Epoch: h.Epoch, Step: h.Step}
		if h.MicroBatch > 0 || h.Index > 0 { // the step's first chunks were acknowledged
			avail.Step++
		}
	}
	if need.Less(avail) {
		done := make(chan error, 1)
		if err := c.delivery.Rewind(ctx, rank, need, "register", done); err != nil {
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
	c.SetNext(rank, need, true)
	return nil
}

// SetNext records the first step rank's trainer still needs (in memory and
// in deliver.KeyPositions; with force it may move backwards: a register) and wakes
// the publisher when it moved.
func (c *Control) SetNext(rank int, next proto.Pos, force bool) {
	if c.ranks.SetNext(rank, next, force) {
		c.delivery.Poke()
	}
}

// CheckRank validates a control message's job and ranks.
func (c *Control) CheckRank(job string, dp, mp int) (int, error) {
	if job != c.cfg.Job {
		return 0, fmt.Errorf("serve: control message for job %q, this service runs %q: %w", job, c.cfg.Job, proto.ErrControl)
	}
	if dp >= c.cfg.Layout.DP || mp >= c.cfg.Layout.MP {
		return 0, fmt.Errorf("serve: control message for rank dp=%d mp=%d outside dp=%d mp=%d: %w", dp, mp, c.cfg.Layout.DP, c.cfg.Layout.MP, proto.ErrLayout)
	}
	return dp*c.cfg.Layout.MP + mp, nil
}

// handleFeedback records a rank's measured step: its position, the
// Prometheus timings, the live report and a calibration observation.
func (c *Control) handleFeedback(m *nats.Msg) {
	var fb proto.Feedback
	err := proto.DecodeControl(m.Data, &fb)
	rank := 0
	if err == nil {
		rank, err = c.CheckRank(fb.Job, fb.DPRank, fb.MPRank)
	}
	if err != nil {
		c.BadControl(proto.CtlFeedback, err)
		return
	}
	c.met.Control(proto.CtlFeedback, "ok")
	c.met.Feedback(fb)
	if f, ok := c.epochs.Features(fb.Epoch, fb.Step, fb.DPRank); ok {
		c.cal.Add(fb, f)
	}
	c.live.Measured(fb)
	c.advanceAcked(c.tasks.Context(), rank, proto.Pos{Epoch: fb.Epoch, Step: fb.Step + 1}, 0)
}

// unacked returns the first step rank has not acknowledged: the step of the
// first chunk its subject still stores (work-queue retention drops what is
// acknowledged), or, when nothing is stored, the rank's publish cursor
// (everything before it was published and acknowledged). The cursor is read
// first: what is published after that is still stored when the stream is
// looked at.
func (c *Control) unacked(ctx context.Context, rank int) (proto.Pos, error) {
	bound := c.ranks.Cursor(rank)
	h, stored, err := c.plane.FirstHeld(ctx, rank)
	if err != nil {
		return proto.Pos{}, err
	}
	if stored {
		bound = proto.Pos{Epoch: h.Epoch, Step: h.Step}
	}
	return c.epochs.Norm(bound), nil
}

// advanceAcked moves rank's next needed step forward to want, but never past
// what the rank acknowledged: a message alone (a forged or early feedback or
// done) cannot make the service treat unacknowledged batches as consumed, or
// end the job. When want is ahead, it polls for up to wait for the
// acknowledgements to land (a trainer may ack asynchronously just before it
// reports), then moves as far as they go.
func (c *Control) advanceAcked(ctx context.Context, rank int, want proto.Pos, wait time.Duration) {
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
			c.SetNext(rank, want, false)
			return
		}
		if time.Now().After(deadline) {
			if wait > 0 {
				c.met.Control(proto.CtlDone, "unacknowledged")
				c.rlog.Warn("done:unacknowledged", "rank reports past what it acknowledged; kept at its first unacknowledged step",
					"rank", rank, "reported_epoch", want.Epoch, "reported_step", want.Step, "unacked_epoch", bound.Epoch, "unacked_step", bound.Step)
			}
			c.SetNext(rank, bound, false)
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
func (c *Control) handleDone(m *nats.Msg) {
	var d proto.Done
	err := proto.DecodeControl(m.Data, &d)
	rank := 0
	if err == nil {
		rank, err = c.CheckRank(d.Job, d.DPRank, d.MPRank)
	}
	if err != nil {
		c.BadControl(proto.CtlDone, err)
		return
	}
	c.met.Control(proto.CtlDone, "ok")
	c.log.Info("rank done", "dp", d.DPRank, "mp", d.MPRank, "epoch", d.Epoch, "steps", d.Steps)
	c.tasks.Start(func(ctx context.Context) {
		c.advanceAcked(ctx, rank, proto.Pos{Epoch: d.Epoch + 1, Step: 0}, doneAckWait)
	})
}

// doneAckWait bounds how long a done waits for the rank's last
// acknowledgements to reach the stream before it counts only what was
// acknowledged.
var doneAckWait = 10 * time.Second // a variable so tests can shorten it

// SetDoneAckWait sets how long a done waits for the rank's last
// acknowledgements (10 s) and returns what restores it: tests shorten it.
// Call it before the service starts.
func SetDoneAckWait(d time.Duration) (restore func()) {
	old := doneAckWait
	doneAckWait = d
	return func() { doneAckWait = old }
}

// handleResend republishes a rank from the failed batch's step with a new
// generation.
func (c *Control) handleResend(m *nats.Msg) {
	var r proto.Resend
	err := proto.DecodeControl(m.Data, &r)
	rank := 0
	if err == nil {
		rank, err = c.CheckRank(r.Job, r.DPRank, r.MPRank)
	}
	if err != nil {
		c.BadControl(proto.CtlResend, err)
		answerResend(m, err)
		return
	}
	// Received: a client that asked (request-reply) stops retrying.
	answerResend(m, nil)
	if !c.gate.startResend(rank) { // the rewind in flight replays this step too
		c.met.Control(proto.CtlResend, "merged")
		return
	}
	c.met.Control(proto.CtlResend, "ok")
	c.rlog.Warn("resend:ok", "resend requested", "dp", r.DPRank, "mp", r.MPRank, "epoch", r.Epoch, "step", r.Step, "micro_batch", r.MicroBatch, "reason", r.Reason)
	started := c.tasks.Start(func(ctx context.Context) {
		defer c.gate.endResend(rank)
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		to, err := c.resendFrom(ctx, rank, proto.Pos{Epoch: r.Epoch, Step: r.Step})
		if err == nil {
			err = c.delivery.Rewind(ctx, rank, to, "resend: "+r.Reason, nil)
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
func (c *Control) resendFrom(ctx context.Context, rank int, asked proto.Pos) (proto.Pos, error) {
	bound, err := c.unacked(ctx, rank)
	if err != nil {
		return proto.Pos{}, err
	}
	if asked.Less(bound) {
		return proto.Pos{}, fmt.Errorf("serve: resend of epoch %d step %d, which rank %d acknowledged (first unacknowledged: epoch %d step %d): %w",
			asked.Epoch, asked.Step, rank, bound.Epoch, bound.Step, proto.ErrControl)
	}
	return bound, nil
}

// BadControl counts a refused message of kind and logs it (at most one
// line per kind a second).
func (c *Control) BadControl(kind string, err error) {
	c.met.Control(kind, "refused")
	c.rlog.Warn("control:"+kind, "bad control message", "kind", kind, "err", err)
}
