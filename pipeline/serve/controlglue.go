package serve

import (
	"context"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline/serve/control"
	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
)

// ServiceInboxPrefix is the reply inbox prefix of the service's own
// connection (natsenv.ServiceInboxPrefix).
const ServiceInboxPrefix = natsenv.ServiceInboxPrefix

// setupControl creates the reply guard and the control handlers, which act
// on the service's parts through controlGlue. Called once, by New.
func (s *Service) setupControl() {
	g := controlGlue{s}
	s.rlog = control.NewRateLog(s.log)
	s.replies = control.NewGuard(s.cfg.Job, s.cfg.Pipeline.Plan.DP, s.cfg.MP, g, s.rlog)
	s.ctl = control.New(control.Config{Job: s.cfg.Job, Layout: s.cfg.layout(), FirstEpoch: s.cfg.Pipeline.Plan.Epoch,
		LastEpoch: s.cfg.lastEpoch(), Pack: s.cfg.Pipeline.Plan.Pack, RegisterWait: s.cfg.RegisterWait},
		control.Parts{Log: s.log, RateLog: s.rlog, Metrics: g, Replies: s.replies, Ranks: s.ranks, Epochs: s.epochs,
			Calibrator: g, Report: g, Tasks: g, Plane: g, Delivery: g})
}

// controlGlue gives control the service's metrics, calibrator, live
// report, tasks, data plane, publish loop and resize decision through
// control's interfaces; each call goes to the part that owns the state.
type controlGlue struct{ s *Service }

func (g controlGlue) Control(kind, result string) {
	g.s.met.control.WithLabelValues(kind, result).Inc()
}

func (g controlGlue) ReplyRefused(kind, reason string) {
	g.s.met.repliesRefused.WithLabelValues(kind, reason).Inc()
}

func (g controlGlue) Feedback(fb proto.Feedback) { g.s.met.feedback(fb) }

func (g controlGlue) Add(fb proto.Feedback, f balancer.Features) { g.s.cal.add(fb, f) }

func (g controlGlue) Measured(fb proto.Feedback) { g.s.live.Measured(fb) }

func (g controlGlue) Start(f func(ctx context.Context)) bool { return g.s.tasks.start(f) }

func (g controlGlue) Context() context.Context { return g.s.tasks.context() }

func (g controlGlue) FirstHeld(ctx context.Context, rank int) (proto.ChunkHeader, bool, error) {
	return g.s.plane.FirstHeld(ctx, rank)
}

func (g controlGlue) FillRegisterReply(rep *proto.RegisterReply, dp, mp int) {
	g.s.plane.FillRegisterReply(rep, dp, mp)
}

func (g controlGlue) TrainerReplaced(ctx context.Context, rank int) error {
	return g.s.plane.TrainerReplaced(ctx, rank)
}

func (g controlGlue) Rewind(ctx context.Context, rank int, to proto.Pos, reason string, done chan error) error {
	return g.s.publisher.Request(ctx, deliver.Rewind{Rank: rank, To: to, Reason: reason, Done: done})
}

func (g controlGlue) DecideResize(ctx context.Context, epoch, step int) error {
	return g.s.decideResize(ctx, epoch, step)
}

func (g controlGlue) Poke() { g.s.publisher.Poke() }
