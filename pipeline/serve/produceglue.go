package serve

import (
	"context"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/produce"
	"github.com/mmfeed/mmfeed/pipeline/serve/report"
	"github.com/mmfeed/mmfeed/proto"
)

// The publish loop's glue to the producer: what it needs of the Service
// (the epoch book with the service's epoch, the metrics, the resize wait,
// the recalibration and the finished record), given as the producer's
// interfaces; the publisher's and the rank publishers' parts are
// rewindGlue and rankGlue (publishglue.go).

// newProducer creates the publish loop over the service's parts. Called
// once, by prepare, after the work queue is set up.
func (s *Service) newProducer() *produce.Producer {
	c := s.cfg
	g := produceGlue{s}
	return produce.New(produce.Config{Job: c.Job, MP: c.MP, LastEpoch: c.lastEpoch(), Epochs: c.Epochs,
		MicroBatches: c.Pipeline.Plan.MicroBatches, Placement: c.layout().Placement, Image: c.Pipeline.Image,
		StreamMaxBytes: c.StreamMaxBytes, WaitForTrainers: c.WaitForTrainers},
		produce.Parts{Log: s.log, Mem: s.mem, Epochs: produceEpochs{s.epochs, s}, Ranks: s.ranks, Publisher: s.publisher,
			Rewind: rewindGlue{s}, Rank: rankGlue{s}, Work: s.work, Report: s.live, Metrics: g, Service: g})
}

// produceEpochs is the epoch book with the service's epoch (planepoch.go),
// which makes the epoch the one being published.
type produceEpochs struct {
	*epochs.Book
	s *Service
}

func (e produceEpochs) Epoch(ctx context.Context, n int) (*epochs.Plan, error) {
	return e.s.epoch(ctx, n)
}

// produceGlue is the Service's side of the producer: its metrics, the
// resize wait, the recalibration and the finished record.
type produceGlue struct{ s *Service }

func (g produceGlue) Preprocessed(d time.Duration) { g.s.met.stage(stagePreprocess, d) }
func (g produceGlue) Built(d time.Duration)        { g.s.met.stage(stageBuild, d) }
func (g produceGlue) Encoded(d time.Duration)      { g.s.met.stage(stageEncode, d) }
func (g produceGlue) Imbalance(costs []float64)    { g.s.met.imbalance.Observe(report.Imbalance(costs)) }

func (g produceGlue) AwaitResize(ctx context.Context) error { return g.s.awaitResize(ctx) }

func (g produceGlue) RecalibrateDue(ctx context.Context, ep *epochs.Plan, step int, queued []proto.Pos) bool {
	return g.s.recalibrateDue(ctx, ep, step, queued)
}

func (g produceGlue) RecordFinished(ctx context.Context, lastEpoch int) error {
	return g.s.st.putInt(ctx, kvFinished, lastEpoch)
}
