package serve

import (
	"context"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
)

// The publish loop's glue: what the publisher (deliver.Publisher) needs of
// the Service to apply a rewind, and what a rank's publisher
// (deliver.PublishRank) hands its micro-batches to.

// rewindGlue is the Service's side of a rewind (RewindParts): the data
// plane's drop, the rewinds counter and the log.
type rewindGlue struct{ s *Service }

func (g rewindGlue) Drop(ctx context.Context, rank int) error { return g.s.plane.drop(ctx, rank) }

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
	return g.s.plane.hold(ctx, rank, m, since)
}

func (g rankGlue) Published(bytes, samples int) { g.s.met.published(bytes, samples) }

// fetchGlue is the Service's side of answering a fetch (FetchParts): the
// send on the fetch's inbox and the log of a handed record not written.
type fetchGlue struct{ s *Service }

func (g fetchGlue) Send(reply string, it *deliver.Item) { g.s.send(reply, it) }

func (g fetchGlue) HandFailed(rank int, err error) {
	g.s.rlog.Warn("kv:handed", "kv rank handed: batch not sent", "rank", rank, "err", err)
}
