package serve

import (
	"context"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// streamPoll is how often the JetStream data plane reads the stream and
// consumer state (deliver.PlaneConfig.Poll).
var streamPoll = 2 * time.Second // a variable so tests can lengthen it

// newDataPlane returns the data plane cfg names (deliver.DataPlane: the
// core plane or the JetStream plane), over the Service's glue: the one
// place that reads which plane the service runs.
func newDataPlane(s *Service) deliver.DataPlane {
	c := s.cfg
	pc := deliver.PlaneConfig{Job: c.Job, Name: c.DataPlane, Ranks: c.ranks(), MP: c.MP,
		FirstEpoch: c.Pipeline.Plan.Epoch, LastEpoch: c.lastEpoch(), MicroBatches: c.Pipeline.Plan.MicroBatches,
		MaxBytes: c.StreamMaxBytes, Publisher: c.Publisher, GiveUpAfter: c.GiveUpAfter, Poll: streamPoll,
		JobMismatch: ErrJobMismatch, Log: s.log}
	if c.core() {
		return deliver.NewCorePlane(pc, s.ranks, s.publisher, coreGlue{s})
	}
	return deliver.NewStreamPlane(pc, s.ranks, s.publisher, s.epochs, streamGlue{coreGlue{s}})
}

// streamGlue is the Service's side of the JetStream data plane
// (deliver.StreamParts): the connection, the job's assets as Config
// declares them, the asset recreation's record, the health's publish in
// flight, and the publishes' metrics and log.
type streamGlue struct{ coreGlue }

func (g streamGlue) JetStream() jetstream.JetStream { return g.s.js }

func (g streamGlue) EnsureStream(ctx context.Context) (jetstream.Stream, error) {
	return g.s.cfg.assets().EnsureStream(ctx, g.s.js)
}

func (g streamGlue) EnsureConsumer(ctx context.Context, dp, mp int) error {
	_, err := g.s.cfg.assets().EnsureConsumer(ctx, g.s.js, dp, mp)
	return err
}

func (g streamGlue) Recreate(asset string, do func() error) error { return g.s.recreate(asset, do) }
func (g streamGlue) Publishing(on bool)                           { g.s.health.publishing(on) }
func (g streamGlue) Retried(n int)                                { g.s.met.retries.Add(float64(n)) }

func (g streamGlue) PublishFailed(key proto.BatchKey, n int, lasted time.Duration, err error) {
	escalate(g.s.log.With("batch", key.String()), "publish failed, retrying", n, lasted, g.s.cfg.StuckAfter, err)
}

// The core data plane's own parts (deliver.CorePlaneParts beyond its
// handlers'): the connection, a viewer's batch built again (package produce) and
// the reply guard for a viewer's inbox.

func (g coreGlue) Conn() *nats.Conn { return g.s.nc }

func (g coreGlue) BuildView(ctx context.Context, rank int, key proto.BatchKey) ([]byte, bool, error) {
	return g.s.produce.BuildView(ctx, rank, key)
}

func (g coreGlue) AllowView(m *nats.Msg) bool {
	return g.s.replies.Allow("view", m, natsenv.ViewerInboxPrefix)
}
