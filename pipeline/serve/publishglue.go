package serve

import (
	"context"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// The publish loop's glue: what the publisher (deliver.Publisher) needs of
// the Service to apply a rewind, what a rank's publisher
// (deliver.PublishRank) hands its micro-batches to, and what the core data
// plane's handlers (Core) need of it.

// rewindGlue is the Service's side of a rewind (RewindParts): the data
// plane's drop, the rewinds counter and the log.
type rewindGlue struct{ s *Service }

func (g rewindGlue) Drop(ctx context.Context, rank int) error { return g.s.plane.Drop(ctx, rank) }

func (g rewindGlue) Rewound(req deliver.Rewind, gen int) {
	s := g.s
	dp, mp := req.Rank/s.cfg.MP, req.Rank%s.cfg.MP
	s.met.rewinds.Inc()
	s.log.Info("rewind", "dp", dp, "mp", mp, "epoch", req.To.Epoch, "step", req.To.Step, "generation", gen, "reason", req.Reason)
}

func (g rewindGlue) RewindFailed(req deliver.Rewind, err error) {
	g.s.log.Warn("rewind failed", "rank", req.Rank, "err", err)
}

// rankGlue is the Service's side of a rank's publisher (RankParts): the
// data plane's hold and the published counters.
type rankGlue struct{ s *Service }

func (g rankGlue) Hold(ctx context.Context, rank int, m deliver.Out, since time.Time) error {
	return g.s.plane.Hold(ctx, rank, m, since)
}

func (g rankGlue) Published(bytes, samples int) { g.s.met.published(bytes, samples) }

// coreGlue is the Service's side of the core data plane's handlers
// (deliver.HandlerParts; the rest of deliver.CorePlaneParts is in
// plane.go): control's checks, the reply guard, the handlers' tasks, the
// metrics and logs, and the state's health.
type coreGlue struct{ s *Service }

func (g coreGlue) CheckRank(job string, dp, mp int) (int, error) {
	return g.s.ctl.CheckRank(job, dp, mp)
}
func (g coreGlue) BadControl(kind string, err error)            { g.s.ctl.BadControl(kind, err) }
func (g coreGlue) SetNext(rank int, next proto.Pos, force bool) { g.s.ctl.SetNext(rank, next, force) }

func (g coreGlue) Allow(kind string, m *nats.Msg, dp, mp int) bool {
	return g.s.replies.Allow(kind, m, g.s.replies.RankInbox(dp, mp)...)
}

func (g coreGlue) Start(f func(context.Context)) bool { return g.s.tasks.start(f) }
func (g coreGlue) Fetched(result string)              { g.s.met.control.WithLabelValues("fetch", result).Inc() }

func (g coreGlue) Sent(chunks int, took time.Duration) {
	g.s.met.stage(stagePublish, took)
	g.s.met.chunks.Add(float64(chunks))
	g.s.met.nChunks.Add(int64(chunks))
}

func (g coreGlue) SendFailed(key proto.BatchKey, err error) {
	g.s.log.Warn("send batch", "batch", key.String(), "err", err)
}

func (g coreGlue) HandFailed(rank int, err error) {
	g.s.rlog.Warn("kv:handed", "kv rank handed: batch not sent", "rank", rank, "err", err)
}

func (g coreGlue) Recording() bool {
	failing, _ := g.s.health.stateFailure(time.Now())
	return failing == nil
}
