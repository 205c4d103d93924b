package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/internal/ctxutil"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// trainer is a test trainer rank: registers, consumes with proto.Consumer,
// applies whole steps (records their rows), acks, reports feedback and done.
type trainer struct {
	t      testing.TB
	job    string
	dp, mp int
	layout proto.Layout
	url    string
	maxAck int

	core bool // the core data plane: a proto.Fetcher instead of a proto.Consumer

	nc   *nats.Conn
	cons batchSource
	// natsOpts are added to the connection's options (credentials, TLS).
	natsOpts []nats.Option

	mu      sync.Mutex
	applied map[proto.BatchKey][]proto.Row // the trainer's "checkpointed" batches
	reply   proto.RegisterReply
	// computeSeconds, when set, gives the feedback compute time of a step.
	computeSeconds func(epoch, step int) float64
	// stepDelay is slept after each applied step.
	stepDelay time.Duration
	// feedbackDelay, when set, is slept between a step's acks and its
	// feedback (a report that lands after the ack).
	feedbackDelay func(epoch, step int) time.Duration
	// barrier, when set, is called with a step's key before the step is
	// applied: a collective that waits for the other ranks.
	barrier func(ctx context.Context, k proto.BatchKey) error
}

// batchSource is a rank's reader on either data plane.
type batchSource interface {
	Next(ctx context.Context) (*proto.Batch, error)
	Close()
}

func newTrainer(t testing.TB, cfg Config, url string, dp, mp int) *trainer {
	return &trainer{t: t, job: cfg.Job, dp: dp, mp: mp, layout: cfg.layout(), url: url, maxAck: cfg.MaxAckPending,
		core: cfg.core(), applied: map[proto.BatchKey][]proto.Row{}}
}

func (tr *trainer) connect(ctx context.Context) error {
	inbox, _ := proto.InboxPrefix(tr.job, tr.dp, tr.mp)
	opts := append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond), nats.CustomInboxPrefix(inbox)}, tr.natsOpts...)
	nc, err := nats.Connect(tr.url, opts...)
	if err != nil {
		return err
	}
	if tr.core {
		fc := proto.DefaultFetcherConfig(tr.job, tr.dp, tr.mp)
		fc.Timeout = 2 * time.Second
		f, err := proto.NewFetcher(nc, memory.NewGoAllocator(), fc)
		if err != nil {
			nc.Close()
			return err
		}
		tr.nc, tr.cons = nc, f
		return nil
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return err
	}
	cc := proto.DefaultConsumerConfig(tr.job, tr.dp, tr.mp)
	cc.MaxAckPending = tr.maxAck
	cc.ChunkTimeout = 20 * time.Second
	cons, err := proto.NewConsumer(ctx, js, memory.NewGoAllocator(), cc)
	if err != nil {
		nc.Close()
		return err
	}
	tr.nc, tr.cons = nc, cons
	return nil
}

// crash drops the connection without acking what is held.
func (tr *trainer) crash() {
	if tr.cons != nil {
		tr.cons.Close()
	}
	if tr.nc != nil {
		tr.nc.Close()
	}
	tr.nc, tr.cons = nil, nil
}

// register registers the trainer's rank, again when the request or its
// reply is lost (proto.RegisterRank).
func (tr *trainer) register(ctx context.Context, epoch, resume int) (proto.RegisterReply, error) {
	reg := proto.Register{Job: tr.job, DPRank: tr.dp, MPRank: tr.mp, DP: tr.layout.DP, MP: tr.layout.MP,
		Placement: tr.layout.Placement, Epoch: epoch, ResumeStep: resume}
	return proto.RegisterRank(ctx, tr.nc, reg, 0)
}

// registerWith sends reg once on the register subject of job and reg's
// ranks: a crafted register (another job, a rank out of range) whose answer
// a test checks.
func registerWith(ctx context.Context, nc *nats.Conn, job string, reg proto.Register) (proto.RegisterReply, error) {
	b, _ := json.Marshal(reg)
	subj, _ := proto.RankControlSubject(job, proto.CtlRegister, reg.DPRank, reg.MPRank)
	msg, err := nc.RequestWithContext(ctx, subj, b)
	if err != nil {
		return proto.RegisterReply{}, err
	}
	var rep proto.RegisterReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return rep, err
	}
	return rep, nil
}

// resumeStep is the first step of epoch the trainer has not applied.
func (tr *trainer) resumeStep(epoch int) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	s := 0
	for k := range tr.applied {
		if k.Epoch == epoch && k.Step+1 > s {
			s = k.Step + 1
		}
	}
	return s
}

// forget drops applied steps ≥ step of epoch: a checkpoint older than the acks.
func (tr *trainer) forget(epoch, step int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for k := range tr.applied {
		if k.Epoch == epoch && k.Step >= step {
			delete(tr.applied, k)
		}
	}
}

// runEpoch registers for epoch at the trainer's resume step and applies steps
// until the epoch ends (then sends done) or stopAfter steps were applied
// (stopAfter < 0: no limit).
func (tr *trainer) runEpoch(ctx context.Context, epoch, stopAfter int) error {
	if tr.nc == nil {
		if err := tr.connect(ctx); err != nil {
			return err
		}
	}
	resume := tr.resumeStep(epoch)
	rep, err := tr.register(ctx, epoch, resume)
	if err != nil {
		return err
	}
	if !rep.OK {
		return fmt.Errorf("register refused: %s", rep.Error)
	}
	tr.reply = rep
	switch c := tr.cons.(type) {
	case *proto.Consumer:
		c.SkipBefore(epoch, resume)
	case *proto.Fetcher:
		c.AddEpoch(epoch, rep.Steps, rep.MicroBatches)
		c.Start(epoch, resume)
	}
	return tr.consume(ctx, epoch, stopAfter)
}

// consume applies steps from the trainer's resume step with the current
// registration and consumer, without registering again (a trainer that lives
// through a service restart or a NATS outage).
func (tr *trainer) consume(ctx context.Context, epoch, stopAfter int) error {
	rep := tr.reply
	step, mb := tr.resumeStep(epoch), 0
	var held []*proto.Batch
	appliedNow := 0
	for step < rep.Steps {
		if stopAfter >= 0 && appliedNow >= stopAfter {
			for _, b := range held {
				b.Release()
			}
			return nil
		}
		b, err := tr.cons.Next(ctx)
		var be *proto.BatchError
		if errors.As(err, &be) {
			tr.t.Logf("rank %d.%d: %v: resend", tr.dp, tr.mp, be)
			tr.resend(be.Key, be.Err.Error())
			continue
		}
		if err != nil {
			return fmt.Errorf("rank %d.%d epoch %d step %d mb %d: %w", tr.dp, tr.mp, epoch, step, mb, err)
		}
		k := b.Header.BatchKey
		if k.Epoch < epoch || (k.Epoch == epoch && (k.Step < step || (k.Step == step && k.MicroBatch < mb))) {
			b.Release() // an old replay of something already applied
			if err := ackRetry(ctx, b); err != nil {
				return err
			}
			continue
		}
		if k.Epoch != epoch || k.Step != step || k.MicroBatch != mb {
			return fmt.Errorf("rank %d.%d: got %v, want e%d/s%d/mb%d (out of plan order)", tr.dp, tr.mp, k, epoch, step, mb)
		}
		held = append(held, b)
		mb++
		if mb < rep.MicroBatches {
			continue
		}
		if tr.barrier != nil {
			if err := tr.barrier(ctx, held[0].Header.BatchKey); err != nil {
				return fmt.Errorf("rank %d.%d: step %d: %w", tr.dp, tr.mp, step, err)
			}
		}
		if err := tr.apply(ctx, held); err != nil {
			return err
		}
		held, mb = held[:0], 0
		step++
		if tr.stepDelay > 0 {
			time.Sleep(tr.stepDelay) // training time
		}
		appliedNow++
	}
	return tr.done(epoch, rep.Steps)
}

// apply records a whole step, acks it and reports feedback.
func (tr *trainer) apply(ctx context.Context, held []*proto.Batch) error {
	for _, b := range held {
		meta, rows, err := proto.ReadRows(b.Record)
		if err != nil {
			return err
		}
		if meta.VocabSize != 30522 || meta.PadID != 0 { // bert-base-uncased, the tests' tokenizer
			return fmt.Errorf("batch %s carries vocab %d, pad %d; want the tokenizer's 30522, 0", b.Header.BatchKey, meta.VocabSize, meta.PadID)
		}
		rows = cloneRows(rows)
		tr.mu.Lock()
		tr.applied[b.Header.BatchKey] = rows
		tr.mu.Unlock()
	}
	for _, b := range held {
		b.Release()
		if err := ackRetry(ctx, b); err != nil {
			return err
		}
	}
	k := held[0].Header.BatchKey
	secs := 0.01
	if tr.computeSeconds != nil {
		secs = tr.computeSeconds(k.Epoch, k.Step)
	}
	if tr.feedbackDelay != nil {
		if err := ctxutil.Sleep(ctx, tr.feedbackDelay(k.Epoch, k.Step)); err != nil {
			return err
		}
	}
	fb := proto.Feedback{Job: tr.job, Epoch: k.Epoch, Step: k.Step, DPRank: tr.dp, MPRank: tr.mp, ComputeSeconds: secs, DataWaitSeconds: 0.001, Samples: 1}
	return tr.publish(proto.CtlFeedback, fb)
}

func (tr *trainer) done(epoch, steps int) error {
	return tr.publish(proto.CtlDone, proto.Done{Job: tr.job, Epoch: epoch, DPRank: tr.dp, MPRank: tr.mp, Steps: steps})
}

func (tr *trainer) resend(k proto.BatchKey, reason string) {
	_ = tr.publish(proto.CtlResend, proto.Resend{Job: k.Job, Epoch: k.Epoch, Step: k.Step, MicroBatch: k.MicroBatch,
		DPRank: k.DPRank, MPRank: k.MPRank, Reason: reason})
}

func (tr *trainer) publish(kind string, v any) error {
	b, err := proto.EncodeControl(v)
	if err != nil {
		return err
	}
	subj, _ := proto.RankControlSubject(tr.job, kind, tr.dp, tr.mp)
	return tr.nc.Publish(subj, b)
}

// cloneRows copies rows out of a record that is about to be released.
func cloneRows(rows []proto.Row) []proto.Row {
	out := make([]proto.Row, len(rows))
	for i, r := range rows {
		r.InputIDs = append([]int32(nil), r.InputIDs...)
		r.Pixels = append([]byte(nil), r.Pixels...)
		out[i] = r
	}
	return out
}

// runTrainers runs every rank's epochs concurrently and returns them; each
// epoch on a new connection, as the first Python client did.
func runTrainers(t testing.TB, ctx context.Context, cfg Config, url string, epochs []int) []*trainer {
	return runTrainersConn(t, ctx, cfg, url, epochs, true)
}

// runTrainersConn is runTrainers; with reconnect false a rank registers for
// its next epoch on the same connection and consumer.
func runTrainersConn(t testing.TB, ctx context.Context, cfg Config, url string, epochs []int, reconnect bool) []*trainer {
	t.Helper()
	return runTrainersWith(t, ctx, cfg, url, epochs, reconnect, nil)
}

// runTrainersWith is runTrainersConn with setup (when not nil) applied to
// every trainer before it starts.
func runTrainersWith(t testing.TB, ctx context.Context, cfg Config, url string, epochs []int, reconnect bool, setup func(*trainer)) []*trainer {
	t.Helper()
	var trs []*trainer
	for r := range cfg.ranks() {
		tr := newTrainer(t, cfg, url, r/cfg.MP, r%cfg.MP)
		if setup != nil {
			setup(tr)
		}
		trs = append(trs, tr)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(trs))
	for i, tr := range trs {
		wg.Go(func() {
			for _, e := range epochs {
				if errs[i] = tr.runEpoch(ctx, e, -1); errs[i] != nil {
					return
				}
				if reconnect {
					tr.crash()
				}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("trainer %d: %v", i, err)
		}
	}
	for _, tr := range trs {
		tr.crash()
	}
	return trs
}

// ackRetry acknowledges a batch, retrying while the server is away (a restart
// or an outage): acks are idempotent.
func ackRetry(ctx context.Context, b *proto.Batch) error {
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := b.Ack(actx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
