package serve

import (
	"context"

	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
)

// The publish loop's glue: what the publisher (Publisher) needs of the
// Service to apply a rewind.

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
