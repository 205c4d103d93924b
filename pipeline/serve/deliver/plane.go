package deliver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// dataPlane is how the published batches reach the trainers (Config.DataPlane),
// chosen once in New (newDataPlane): the core plane (corePlane: the outbox
// holds each batch until its rank acknowledges it, and a fetch gets it in
// chunks on the fetch's inbox) or the JetStream plane (streamPlane: a stream
// with work-queue retention and one durable consumer per rank). The rest of
// the service asks the plane and never branches on which one it is.
type dataPlane interface {
	// firstHeld is the first chunk the data plane still holds for rank.
	firstHeld(ctx context.Context, rank int) (proto.ChunkHeader, bool, error)
	// fillRegisterReply fills the data plane's part of a register reply.
	fillRegisterReply(rep *proto.RegisterReply, dp, mp int)
	// trainerReplaced tells the plane that a new incarnation of rank's
	// trainer registered: what the old one was delivered and did not
	// acknowledge must come to the new one at once.
	trainerReplaced(ctx context.Context, rank int) error
	// setup creates what the plane holds batches in, before the job record
	// is checked: the outbox, or the stream, every rank's consumer and the
	// stream publisher.
	setup(ctx context.Context) error
	// hold hands one encoded batch of rank to the plane, in plan order: it
	// waits while the outbox is over its bound, or publishes to the stream
	// (retrying until ctx ends) and times the publish stage from since.
	hold(ctx context.Context, rank int, m deliver.Out, since time.Time) error
	// drop drops everything the plane holds for rank (a rewind).
	drop(ctx context.Context, rank int) error
	// restoredCursor returns where a restarted service continues publishing
	// rank, given the cursor its KV record names: there on the core plane
	// (nothing outlives the service), or after the last batch the stream
	// still stores for the rank when that is later.
	restoredCursor(ctx context.Context, rank int, cursor proto.Pos) (proto.Pos, error)
	// resizable returns nil when the plane can serve the job after a dp
	// change from dp to the service's, an ErrJobMismatch otherwise.
	resizable(job string, from, to int) error
	// subscribe installs the plane's handlers (the ranks' fetches, views and
	// acks on the core plane; none on the JetStream plane).
	subscribe(ctx context.Context) ([]*nats.Subscription, error)
	// startParts starts the plane's own loops in g (the stream poll).
	startParts(g *errgroup.Group, gctx context.Context)
	// checkAssets recreates the plane's JetStream assets that are lost (the
	// stream and the consumers; the core plane has none).
	checkAssets(ctx context.Context) error
	// collect sends the gauges of what the plane holds, from memory (a
	// scrape makes no NATS request): the outbox's bytes, or the last
	// stream snapshot pollStream took.
	collect(ch chan<- prometheus.Metric)
}

// newDataPlane returns the data plane cfg names: the one place that reads
// which plane the service runs.
func newDataPlane(s *Service) dataPlane {
	if s.cfg.core() {
		return corePlane{s}
	}
	return streamPlane{s}
}

// corePlane is the core NATS data plane: batches wait in the outbox (s.out)
// until a fetch of their rank asks for them and are dropped on the rank's ack
// (deliver.Core, through subscribeData).
type corePlane struct{ s *Service }

func (p corePlane) setup(context.Context) error {
	s := p.s
	s.out = deliver.NewOutbox(s.cfg.ranks(), s.cfg.StreamMaxBytes)
	s.views = make(chan struct{}, maxViews)
	var err error
	if s.chunkSize, err = proto.ChunkSize(s.nc.MaxPayload()); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

func (p corePlane) hold(ctx context.Context, rank int, m deliver.Out, _ time.Time) error {
	return p.s.out.Put(ctx, rank, deliver.NewItem(m.Key(), m.Gen(), m.Payload()))
}

func (p corePlane) drop(_ context.Context, rank int) error {
	p.s.out.Purge(rank)
	return nil
}

func (p corePlane) restoredCursor(_ context.Context, _ int, cursor proto.Pos) (proto.Pos, error) {
	return cursor, nil
}

func (p corePlane) resizable(string, int, int) error { return nil }

func (p corePlane) subscribe(ctx context.Context) ([]*nats.Subscription, error) {
	return p.s.subscribeData(ctx)
}

func (p corePlane) startParts(*errgroup.Group, context.Context) {}

func (p corePlane) checkAssets(context.Context) error { return nil }

func (p corePlane) collect(ch chan<- prometheus.Metric) {
	if p.s.out != nil { // set up
		ch <- prometheus.MustNewConstMetric(descOutboxBytes, prometheus.GaugeValue, float64(p.s.out.Size()))
	}
}

func (p corePlane) firstHeld(_ context.Context, rank int) (proto.ChunkHeader, bool, error) {
	k, ok := p.s.out.First(rank)
	return proto.ChunkHeader{BatchKey: k}, ok, nil
}

func (p corePlane) fillRegisterReply(rep *proto.RegisterReply, dp, mp int) {
	rep.DataPlane = p.s.cfg.DataPlane
	rep.FetchSubject, _ = proto.FetchSubject(p.s.cfg.Job, dp, mp)
	rep.AckSubject, _ = proto.AckSubject(p.s.cfg.Job, dp, mp)
}

// trainerReplaced: the outbox keeps what it holds; the new incarnation
// fetches it again.
func (p corePlane) trainerReplaced(context.Context, int) error { return nil }

// streamPlane is the JetStream data plane: batches are published to the
// job's stream (s.stream, s.pub) and each rank's durable consumer delivers
// them; work-queue retention drops what the rank acknowledged.
type streamPlane struct{ s *Service }

func (p streamPlane) setup(ctx context.Context) error {
	s, c := p.s, p.s.cfg
	var err error
	s.stream, err = c.assets().EnsureStream(ctx, s.js)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	for r := range c.ranks() {
		if _, err := c.assets().EnsureConsumer(ctx, s.js, r/c.MP, r%c.MP); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}
	if s.pub, err = proto.NewPublisher(s.nc, s.js, c.Publisher); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

func (p streamPlane) hold(ctx context.Context, _ int, m deliver.Out, since time.Time) error {
	if err := p.s.publish(ctx, m.Key(), m.Gen(), m.Payload()); err != nil {
		return err
	}
	p.s.met.stage(stagePublish, time.Since(since))
	return nil
}

func (p streamPlane) drop(ctx context.Context, rank int) error {
	subj, _ := proto.BatchSubject(p.s.cfg.Job, rank/p.s.cfg.MP, rank%p.s.cfg.MP)
	if err := p.s.stream.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
		return fmt.Errorf("serve: purge %s: %w", subj, err)
	}
	return nil
}

func (p streamPlane) restoredCursor(ctx context.Context, rank int, cursor proto.Pos) (proto.Pos, error) {
	last, ok, err := p.s.lastStored(ctx, rank/p.s.cfg.MP, rank%p.s.cfg.MP)
	if err != nil {
		return cursor, err
	}
	if ok && cursor.Less(last) {
		return last, nil
	}
	return cursor, nil
}

func (p streamPlane) resizable(job string, from, to int) error {
	return fmt.Errorf("serve: job %s: a resize (dp %d -> %d) needs the core data plane; the JetStream data plane still stores the old layout's batches: %w",
		job, from, to, ErrJobMismatch)
}

func (p streamPlane) subscribe(context.Context) ([]*nats.Subscription, error) { return nil, nil }

func (p streamPlane) startParts(g *errgroup.Group, gctx context.Context) {
	g.Go(func() error { return p.s.pollStream(gctx) })
}

func (p streamPlane) checkAssets(ctx context.Context) error { return p.s.checkStreamAssets(ctx) }

func (p streamPlane) collect(ch chan<- prometheus.Metric) {
	snap := p.s.streamSnap.Load()
	if snap == nil { // not polled yet
		return
	}
	ch <- prometheus.MustNewConstMetric(descStreamBytes, prometheus.GaugeValue, float64(snap.bytes))
	ch <- prometheus.MustNewConstMetric(descStreamMsgs, prometheus.GaugeValue, float64(snap.msgs))
	for r, c := range snap.ranks {
		if !c.ok {
			continue
		}
		l := []string{strconv.Itoa(r / p.s.cfg.MP), strconv.Itoa(r % p.s.cfg.MP)}
		ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(c.pending), l...)
		ch <- prometheus.MustNewConstMetric(descAckPending, prometheus.GaugeValue, float64(c.ackPending), l...)
	}
}

func (p streamPlane) firstHeld(ctx context.Context, rank int) (proto.ChunkHeader, bool, error) {
	return p.s.firstStored(ctx, rank/p.s.cfg.MP, rank%p.s.cfg.MP)
}

func (p streamPlane) fillRegisterReply(rep *proto.RegisterReply, _, _ int) {
	rep.DataPlane = p.s.cfg.DataPlane
}

// trainerReplaced recreates the rank's consumer when the old incarnation
// left chunks delivered and unacknowledged (resetConsumer): they come back
// at once instead of after AckWait.
func (p streamPlane) trainerReplaced(ctx context.Context, rank int) error {
	return p.s.resetConsumer(ctx, rank/p.s.cfg.MP, rank%p.s.cfg.MP)
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
	if _, err := s.cfg.assets().EnsureConsumer(ctx, s.js, dp, mp); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
