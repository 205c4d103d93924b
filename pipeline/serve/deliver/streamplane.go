package deliver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StreamParts is what the JetStream plane needs of the service: the
// connection and its JetStream context (Conn, JetStream; read at Setup:
// the service connects after it chose the plane), the job's stream and a
// rank's durable consumer created as the service's assets declare them
// (EnsureStream, EnsureConsumer), the record of a lost asset recreated
// (Recreate: logs, runs do, counts once it succeeded), the health's
// publish in flight (Publishing), and the metrics and log of the stream
// publishes (Retried: chunk publishes repeated; Sent: chunks published and
// the publish stage's time; PublishFailed: the n-th failure in a row of
// one batch's publish, lasting for lasted, to be retried).
type StreamParts interface {
	Conn() *nats.Conn
	JetStream() jetstream.JetStream
	EnsureStream(ctx context.Context) (jetstream.Stream, error)
	EnsureConsumer(ctx context.Context, dp, mp int) error
	Recreate(asset string, do func() error) error
	Publishing(on bool)
	Retried(n int)
	Sent(chunks int, took time.Duration)
	PublishFailed(key proto.BatchKey, n int, lasted time.Duration, err error)
}

// StreamPlane is the JetStream data plane: batches are published to the
// job's stream and each rank's durable consumer delivers them; work-queue
// retention drops what the rank acknowledged.
type StreamPlane struct {
	cfg    PlaneConfig
	ranks  *Ranks
	pub    *Publisher
	epochs Epochs
	parts  StreamParts

	// Set by Setup, before the service starts its parts.
	stream jetstream.Stream
	sender *proto.Publisher // the stream publisher (proto.Publisher: chunks, ids, backpressure)
	// snap is the last polled stream state (pollStream).
	snap atomic.Pointer[StreamGauges]
}

// NewStreamPlane returns the JetStream data plane of cfg's job over the
// rank table, the publisher (a lost stream's rewinds) and the epoch book
// (the position after a rank's last stored batch); Setup creates its
// stream and consumers.
func NewStreamPlane(cfg PlaneConfig, ranks *Ranks, pub *Publisher, ep Epochs, parts StreamParts) *StreamPlane {
	return &StreamPlane{cfg: cfg, ranks: ranks, pub: pub, epochs: ep, parts: parts}
}

func (p *StreamPlane) Setup(ctx context.Context) error {
	c := p.cfg
	var err error
	p.stream, err = p.parts.EnsureStream(ctx)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	for r := range c.Ranks {
		if err := p.parts.EnsureConsumer(ctx, r/c.MP, r%c.MP); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}
	if p.sender, err = proto.NewPublisher(p.parts.Conn(), p.parts.JetStream(), c.Publisher); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

func (p *StreamPlane) Hold(ctx context.Context, _ int, m Out, since time.Time) error {
	chunks, err := p.publish(ctx, m.Key(), m.Gen(), m.Payload())
	if err != nil {
		return err
	}
	p.parts.Sent(chunks, time.Since(since))
	return nil
}

func (p *StreamPlane) Drop(ctx context.Context, rank int) error {
	subj, _ := proto.BatchSubject(p.cfg.Job, rank/p.cfg.MP, rank%p.cfg.MP)
	if err := p.stream.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
		return fmt.Errorf("serve: purge %s: %w", subj, err)
	}
	return nil
}

func (p *StreamPlane) RestoredCursor(ctx context.Context, rank int, cursor proto.Pos) (proto.Pos, error) {
	last, ok, err := p.lastStored(ctx, rank/p.cfg.MP, rank%p.cfg.MP)
	if err != nil {
		return cursor, err
	}
	if ok && cursor.Less(last) {
		return last, nil
	}
	return cursor, nil
}

func (p *StreamPlane) Resizable(job string, from, to int) error {
	return fmt.Errorf("serve: job %s: a resize (dp %d -> %d) needs the core data plane; the JetStream data plane still stores the old layout's batches: %w",
		job, from, to, p.cfg.JobMismatch)
}

func (p *StreamPlane) Subscribe(context.Context) ([]*nats.Subscription, error) { return nil, nil }

func (p *StreamPlane) Run(ctx context.Context) error { return p.pollStream(ctx) }

func (p *StreamPlane) CheckAssets(ctx context.Context) error { return p.checkStreamAssets(ctx) }

func (p *StreamPlane) Gauges() PlaneGauges {
	snap := p.snap.Load()
	if snap == nil { // not polled yet
		return PlaneGauges{}
	}
	g := *snap
	g.Ranks = slices.Clone(snap.Ranks)
	return PlaneGauges{Stream: &g}
}

func (p *StreamPlane) FirstHeld(ctx context.Context, rank int) (proto.ChunkHeader, bool, error) {
	return p.firstStored(ctx, rank/p.cfg.MP, rank%p.cfg.MP)
}

func (p *StreamPlane) FillRegisterReply(rep *proto.RegisterReply, _, _ int) {
	rep.DataPlane = p.cfg.Name
}

// TrainerReplaced recreates the rank's consumer when the old incarnation
// left chunks delivered and unacknowledged (resetConsumer): they come back
// at once instead of after AckWait.
func (p *StreamPlane) TrainerReplaced(ctx context.Context, rank int) error {
	return p.resetConsumer(ctx, rank/p.cfg.MP, rank%p.cfg.MP)
}

// resetConsumer recreates a rank's durable consumer when an earlier
// incarnation of the trainer left chunks delivered and unacknowledged: the new
// consumer delivers everything still stored, in order, at once, instead of
// after AckWait. Work-queue retention keeps unacknowledged chunks in the
// stream while no consumer exists.
func (p *StreamPlane) resetConsumer(ctx context.Context, dp, mp int) error {
	name := proto.ConsumerName(p.cfg.Job, dp, mp)
	cons, err := p.stream.Consumer(ctx, name)
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
		if err := p.stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("serve: reset consumer %s: %w", name, err)
		}
		p.cfg.Log.Info("consumer reset: redelivering unacknowledged chunks", "dp", dp, "mp", mp)
	}
	if err := p.parts.EnsureConsumer(ctx, dp, mp); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// lastStored returns the step after the last batch stored for a rank, or
// that batch's step when its micro-batch is not the step's last.
func (p *StreamPlane) lastStored(ctx context.Context, dp, mp int) (proto.Pos, bool, error) {
	subj, _ := proto.BatchSubject(p.cfg.Job, dp, mp)
	m, err := p.stream.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return proto.Pos{}, false, nil
	}
	if err != nil {
		return proto.Pos{}, false, fmt.Errorf("serve: last message of %s: %w", subj, err)
	}
	h, err := proto.ParseChunkHeader(m.Header)
	if err != nil {
		return proto.Pos{}, false, nil // not ours to interpret: republish from the trainer's position
	}
	if h.MicroBatch == p.cfg.MicroBatches-1 && h.Index == h.Count-1 {
		return p.epochs.Norm(proto.Pos{Epoch: h.Epoch, Step: h.Step + 1}), true, nil
	}
	return proto.Pos{Epoch: h.Epoch, Step: h.Step}, true, nil
}

// firstStored returns the first stored batch position of a rank, and whether
// it is whole (its chunk 0 is still there).
func (p *StreamPlane) firstStored(ctx context.Context, dp, mp int) (h proto.ChunkHeader, ok bool, err error) {
	subj, _ := proto.BatchSubject(p.cfg.Job, dp, mp)
	m, err := p.stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subj))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return h, false, nil
	}
	if err != nil {
		return h, false, fmt.Errorf("serve: first message of %s: %w", subj, err)
	}
	h, err = proto.ParseChunkHeader(m.Header)
	return h, err == nil, nil
}

// pollStream keeps the stream snapshot Gauges returns current until ctx
// ends, polling every PlaneConfig.Poll, so that a Prometheus scrape makes
// no JetStream request.
func (p *StreamPlane) pollStream(ctx context.Context) error {
	for {
		rctx, cancel := context.WithTimeout(ctx, p.cfg.Poll)
		snap := &StreamGauges{Ranks: make([]RankGauges, p.cfg.Ranks)}
		if info, err := p.stream.Info(rctx); err == nil {
			snap.Bytes, snap.Msgs = info.State.Bytes, info.State.Msgs
			for r := range snap.Ranks {
				cons, err := p.stream.Consumer(rctx, proto.ConsumerName(p.cfg.Job, r/p.cfg.MP, r%p.cfg.MP))
				if err != nil {
					continue
				}
				if ci, err := cons.Info(rctx); err == nil {
					snap.Ranks[r] = RankGauges{Polled: true, Pending: ci.NumPending, AckPending: uint64(ci.NumAckPending)}
				}
			}
			p.snap.Store(snap)
		}
		cancel()
		t := time.NewTimer(p.cfg.Poll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil
		}
	}
}

// checkStreamAssets recreates the JetStream data plane's stream and
// consumers when they are missing.
func (p *StreamPlane) checkStreamAssets(ctx context.Context) error {
	c := p.cfg
	if _, err := p.parts.JetStream().Stream(ctx, proto.StreamName(c.Job)); errors.Is(err, jetstream.ErrStreamNotFound) {
		return p.parts.Recreate("stream "+proto.StreamName(c.Job), func() error { return p.recreateStream(ctx) })
	} else if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	for r := range c.Ranks {
		name := proto.ConsumerName(c.Job, r/c.MP, r%c.MP)
		if _, err := p.stream.Consumer(ctx, name); errors.Is(err, jetstream.ErrConsumerNotFound) {
			if err := p.parts.Recreate("consumer "+name, func() error { return p.ensureConsumer(ctx, r) }); err != nil {
				return err
			}
		} else if err != nil {
			return fmt.Errorf("consumer %s: %w", name, err)
		}
	}
	return nil
}

func (p *StreamPlane) ensureConsumer(ctx context.Context, r int) error {
	if err := p.parts.EnsureConsumer(ctx, r/p.cfg.MP, r%p.cfg.MP); err != nil {
		return fmt.Errorf("recreate consumer: %w", err)
	}
	return nil
}

// recreateStream recreates the stream and the consumers, then rewinds every
// rank to its first unacknowledged step: the batches the lost stream held
// are published again (a new generation), so none is lost.
func (p *StreamPlane) recreateStream(ctx context.Context) error {
	c := p.cfg
	if _, err := p.parts.EnsureStream(ctx); err != nil {
		return fmt.Errorf("recreate stream: %w", err)
	}
	for r := range c.Ranks {
		if err := p.ensureConsumer(ctx, r); err != nil {
			return err
		}
	}
	for r := range c.Ranks {
		to := p.ranks.Next(r)
		if err := p.pub.Request(ctx, Rewind{Rank: r, To: to, Reason: "stream recreated"}); err != nil {
			return err
		}
	}
	return nil
}

// publish sends one payload, retrying transient failures (a lost connection)
// with the same message ids until ctx ends; stream-full backpressure is
// retried inside proto.Publisher. It returns the chunks published.
func (p *StreamPlane) publish(ctx context.Context, key proto.BatchKey, gen int, payload []byte) (int, error) {
	backoff := 100 * time.Millisecond
	p.parts.Publishing(true)
	defer p.parts.Publishing(false)
	start := time.Now()
	for n := 1; ; n++ {
		st, err := p.sender.Publish(ctx, key, gen, payload)
		p.parts.Retried(st.Retries)
		if err == nil {
			return st.Chunks, nil
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if permanent(err) {
			return 0, fmt.Errorf("serve: %w", err)
		}
		p.parts.Retried(1)
		p.parts.PublishFailed(key, n, time.Since(start), err)
		if p.cfg.GiveUpAfter > 0 && time.Since(start) > p.cfg.GiveUpAfter {
			return 0, fmt.Errorf("serve: publish %s failing for %s: %w", key, time.Since(start).Round(time.Second), err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func permanent(err error) bool {
	for _, e := range []error{proto.ErrTooLarge, proto.ErrInvalidConfig, proto.ErrInvalidMeta, proto.ErrInvalidRow, proto.ErrInvalidName, proto.ErrSchema} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
