package deliver

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// DataPlane is how the published batches reach the trainers (serve's
// Config.DataPlane), chosen once by the service: the core plane (CorePlane:
// the outbox holds each batch until its rank acknowledges it, and a fetch
// gets it in chunks on the fetch's inbox) or the JetStream plane
// (StreamPlane: a stream with work-queue retention and one durable consumer
// per rank). The rest of the service asks the plane and never branches on
// which one it is.
type DataPlane interface {
	// FirstHeld is the first chunk the data plane still holds for rank.
	FirstHeld(ctx context.Context, rank int) (proto.ChunkHeader, bool, error)
	// FillRegisterReply fills the data plane's part of a register reply.
	FillRegisterReply(rep *proto.RegisterReply, dp, mp int)
	// TrainerReplaced tells the plane that a new incarnation of rank's
	// trainer registered: what the old one was delivered and did not
	// acknowledge must come to the new one at once.
	TrainerReplaced(ctx context.Context, rank int) error
	// Setup creates what the plane holds batches in, before the job record
	// is checked: the outbox, or the stream, every rank's consumer and the
	// stream publisher.
	Setup(ctx context.Context) error
	// Hold hands one encoded batch of rank to the plane, in plan order: it
	// waits while the outbox is over its bound, or publishes to the stream
	// (retrying until ctx ends) and times the publish stage from since.
	Hold(ctx context.Context, rank int, m Out, since time.Time) error
	// Drop drops everything the plane holds for rank (a rewind).
	Drop(ctx context.Context, rank int) error
	// RestoredCursor returns where a restarted service continues publishing
	// rank, given the cursor its KV record names: there on the core plane
	// (nothing outlives the service), or after the last batch the stream
	// still stores for the rank when that is later.
	RestoredCursor(ctx context.Context, rank int, cursor proto.Pos) (proto.Pos, error)
	// Resizable returns nil when the plane can serve the job after a dp
	// change from dp to the service's, an error wrapping
	// PlaneConfig.JobMismatch otherwise.
	Resizable(job string, from, to int) error
	// Subscribe installs the plane's handlers (the ranks' fetches, views and
	// acks on the core plane; none on the JetStream plane).
	Subscribe(ctx context.Context) ([]*nats.Subscription, error)
	// Run runs the plane's own loops until ctx ends (the stream poll; the
	// core plane has none and returns at once).
	Run(ctx context.Context) error
	// CheckAssets recreates the plane's JetStream assets that are lost (the
	// stream and the consumers; the core plane has none).
	CheckAssets(ctx context.Context) error
	// Gauges returns what the plane holds, from memory (a scrape makes no
	// NATS request): the outbox's bytes, or the last stream snapshot the
	// stream poll took.
	Gauges() PlaneGauges
}

// PlaneConfig is the job as a data plane serves it: the job and the plane's
// name (the register reply's), the ranks (MP per dp rank), the epochs it
// serves (FirstEpoch to LastEpoch), the micro-batches of a step and the
// bound of what it holds (MaxBytes: the outbox's, or the stream's, whose
// half is the room Gauges' readers compare with). The JetStream plane's
// own: its publisher's tuning, how long a publish retries (GiveUpAfter, 0:
// until ctx ends), how often the stream is polled (Poll), the error a
// refused resize wraps (JobMismatch) and the log.
type PlaneConfig struct {
	Job, Name             string
	Ranks, MP             int
	FirstEpoch, LastEpoch int
	MicroBatches          int
	MaxBytes              int64
	Publisher             proto.PublisherConfig
	GiveUpAfter, Poll     time.Duration
	JobMismatch           error
	Log                   *slog.Logger
}

// PlaneGauges is what a data plane holds, as its gauges report it: the
// outbox's bytes once the core plane is set up (Outbox), or the JetStream
// plane's last stream snapshot (Stream; nil before its first poll).
type PlaneGauges struct {
	Outbox      bool
	OutboxBytes int64
	Stream      *StreamGauges
}

// StreamGauges is one poll of the job's stream: its bytes and messages,
// and per rank what its consumer has pending and unacknowledged.
type StreamGauges struct {
	Bytes, Msgs uint64
	Ranks       []RankGauges
}

// RankGauges is one rank's consumer as a poll found it (Polled false: its
// consumer could not be read).
type RankGauges struct {
	Polled              bool
	Pending, AckPending uint64
}

// CorePlaneParts is what the core plane needs of the service: its handlers'
// (HandlerParts), the connection (Conn, read at Setup: the service connects
// after it chose the plane), a viewer's batch built again from the plan
// when the outbox no longer holds it (BuildView: the bytes, whether the
// batch is outside the plan) and the reply guard for a viewer fetch
// (AllowView: its reply subject is in a viewer's inbox).
type CorePlaneParts interface {
	HandlerParts
	Conn() *nats.Conn
	BuildView(ctx context.Context, rank int, key proto.BatchKey) ([]byte, bool, error)
	AllowView(m *nats.Msg) bool
}

// CorePlane is the core NATS data plane: batches wait in the outbox until a
// fetch of their rank asks for them and are dropped on the rank's ack
// (Core), and viewers get copies of them (view.go).
type CorePlane struct {
	cfg   PlaneConfig
	ranks *Ranks
	pub   *Publisher
	parts CorePlaneParts

	// Set by Setup, before the service starts its parts.
	out       *Outbox
	views     *viewer
	chunkSize int
}

// NewCorePlane returns the core data plane of cfg's job over the rank table
// and the publisher; Setup creates its outbox.
func NewCorePlane(cfg PlaneConfig, ranks *Ranks, pub *Publisher, parts CorePlaneParts) *CorePlane {
	return &CorePlane{cfg: cfg, ranks: ranks, pub: pub, parts: parts}
}

func (p *CorePlane) Setup(context.Context) error {
	nc := p.parts.Conn()
	p.out = NewOutbox(p.cfg.Ranks, p.cfg.MaxBytes)
	var err error
	if p.chunkSize, err = proto.ChunkSize(nc.MaxPayload()); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	p.views = newViewer(p.layout(), nc, p.out, p.parts, p.cfg.Log)
	return nil
}

// layout is the job's CoreLayout (after Setup: with the chunk size).
func (p *CorePlane) layout() CoreLayout {
	c := p.cfg
	return CoreLayout{Job: c.Job, Ranks: c.Ranks, MP: c.MP, FirstEpoch: c.FirstEpoch, LastEpoch: c.LastEpoch,
		MicroBatches: c.MicroBatches, ChunkSize: p.chunkSize}
}

func (p *CorePlane) Hold(ctx context.Context, rank int, m Out, _ time.Time) error {
	return p.out.Put(ctx, rank, NewItem(m.Key(), m.Gen(), m.Payload()))
}

func (p *CorePlane) Drop(_ context.Context, rank int) error {
	p.out.Purge(rank)
	return nil
}

func (p *CorePlane) RestoredCursor(_ context.Context, _ int, cursor proto.Pos) (proto.Pos, error) {
	return cursor, nil
}

func (p *CorePlane) Resizable(string, int, int) error { return nil }

// Subscribe installs the core data plane's handlers (Core.Subscribe) over
// the service's connection, the outbox, the rank table and the publisher,
// the viewers' among them.
func (p *CorePlane) Subscribe(ctx context.Context) ([]*nats.Subscription, error) {
	return NewCore(p.parts.Conn(), p.layout(), p.out, p.ranks, p.pub, coreViewParts{p.parts, p.views}).Subscribe(ctx)
}

// coreViewParts is the handlers' CoreParts: the service's, and the plane's
// viewers.
type coreViewParts struct {
	CorePlaneParts
	v *viewer
}

func (c coreViewParts) StartView(ctx context.Context, rank int, reply string, key proto.BatchKey) {
	c.v.startView(ctx, rank, reply, key)
}

func (c coreViewParts) SubscribeViews(ctx context.Context) ([]*nats.Subscription, error) {
	return c.v.subscribeViews(ctx)
}

func (p *CorePlane) Run(context.Context) error { return nil }

func (p *CorePlane) CheckAssets(context.Context) error { return nil }

func (p *CorePlane) Gauges() PlaneGauges {
	if p.out == nil { // not set up
		return PlaneGauges{}
	}
	return PlaneGauges{Outbox: true, OutboxBytes: p.out.Size()}
}

func (p *CorePlane) FirstHeld(_ context.Context, rank int) (proto.ChunkHeader, bool, error) {
	k, ok := p.out.First(rank)
	return proto.ChunkHeader{BatchKey: k}, ok, nil
}

func (p *CorePlane) FillRegisterReply(rep *proto.RegisterReply, dp, mp int) {
	rep.DataPlane = p.cfg.Name
	rep.FetchSubject, _ = proto.FetchSubject(p.cfg.Job, dp, mp)
	rep.AckSubject, _ = proto.AckSubject(p.cfg.Job, dp, mp)
}

// TrainerReplaced: the outbox keeps what it holds; the new incarnation
// fetches it again.
func (p *CorePlane) TrainerReplaced(context.Context, int) error { return nil }
