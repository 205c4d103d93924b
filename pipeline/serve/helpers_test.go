package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"reflect"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/loader/synth"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// corpus generates a skewed corpus with some bad samples.
func corpus(t testing.TB, n int) string {
	t.Helper()
	cfg := synth.DefaultConfig()
	cfg.Out, cfg.Samples, cfg.Seed, cfg.Format, cfg.BadFraction = t.TempDir(), n, 7, "jsonl", 0.05
	sum, err := synth.Generate(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return sum.Path
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("MMFEED_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testConfig serves input to dp × mp ranks with small images.
func testConfig(t testing.TB, input string, dp, mp int, placement string) Config {
	t.Helper()
	c := DefaultConfig()
	c.Job = "job-1"
	c.MP = mp
	c.Pipeline.Input = input
	c.Pipeline.Plan.DP, c.Pipeline.Plan.MicroBatches, c.Pipeline.Plan.GlobalBatch = dp, 2, 4*dp
	pl, err := balancer.ParsePlacement(placement)
	if err != nil {
		t.Fatal(err)
	}
	c.Pipeline.Plan.Placement = pl
	c.Pipeline.Image.Size, c.Pipeline.Image.PatchSize = 32, 16
	c.Pipeline.Workers = 2
	c.NATS.Listen = "127.0.0.1:0"
	c.NATS.DataDir = t.TempDir()
	c.StreamMaxBytes = 64 << 20
	c.Duplicates = 30 * time.Second
	c.HTTP = "127.0.0.1:0"
	c.RegisterWait = 20 * time.Second
	c.Logger = testLogger(t)
	return c
}

// running is a Service running in the background.
type running struct {
	s      *Service
	cancel context.CancelFunc
	errc   chan error
}

func start(t testing.TB, cfg Config) *running {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{s: s, cancel: cancel, errc: make(chan error, 1)}
	go func() { r.errc <- s.Run(ctx) }()
	select {
	case <-s.Ready():
	case err := <-r.errc:
		cancel()
		t.Fatalf("service ended before ready: %v", err)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("service not ready after 60s")
	}
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels the service and waits for it; a second call is a no-op.
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.errc:
		if ok {
			close(r.errc)
		}
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("service did not stop within 30s")
	}
	return nil
}

// wait waits for the service to return by itself.
func (r *running) wait(t testing.TB, d time.Duration) error {
	t.Helper()
	select {
	case err, ok := <-r.errc:
		if ok {
			close(r.errc)
		}
		return err
	case <-time.After(d):
		t.Fatalf("service still running after %v", d)
	}
	return nil
}

// checkFor polls f until it returns nil or total passes.
func checkFor(t testing.TB, total, every time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(every)
	}
	t.Fatalf("condition not met after %v: %v", total, err)
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// trainer is a test trainer rank: registers, consumes with proto.Consumer,
// applies whole steps (records their rows), acks, reports feedback and done.
type trainer struct {
	t      testing.TB
	job    string
	dp, mp int
	layout proto.Layout
	url    string
	maxAck int

	nc   *nats.Conn
	cons *proto.Consumer

	mu      sync.Mutex
	applied map[proto.BatchKey][]proto.Row // the trainer's "checkpointed" batches
	reply   proto.RegisterReply
	// computeSeconds, when set, gives the feedback compute time of a step.
	computeSeconds func(epoch, step int) float64
	// stepDelay is slept after each applied step.
	stepDelay time.Duration
}

func newTrainer(t testing.TB, cfg Config, url string, dp, mp int) *trainer {
	return &trainer{t: t, job: cfg.Job, dp: dp, mp: mp, layout: cfg.layout(), url: url, maxAck: cfg.MaxAckPending,
		applied: map[proto.BatchKey][]proto.Row{}}
}

func (tr *trainer) connect(ctx context.Context) error {
	nc, err := nats.Connect(tr.url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		return err
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

func (tr *trainer) register(ctx context.Context, epoch, resume int) (proto.RegisterReply, error) {
	reg := proto.Register{Job: tr.job, DPRank: tr.dp, MPRank: tr.mp, DP: tr.layout.DP, MP: tr.layout.MP,
		Placement: tr.layout.Placement, Epoch: epoch, ResumeStep: resume}
	return registerWith(ctx, tr.nc, tr.job, reg)
}

func registerWith(ctx context.Context, nc *nats.Conn, job string, reg proto.Register) (proto.RegisterReply, error) {
	b, _ := json.Marshal(reg)
	subj, _ := proto.ControlSubject(job, proto.CtlRegister)
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
	tr.cons.SkipBefore(epoch, resume)
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
		_, rows, err := proto.ReadRows(b.Record)
		if err != nil {
			return err
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
	subj, _ := proto.ControlSubject(tr.job, kind)
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
	var trs []*trainer
	for r := range cfg.ranks() {
		trs = append(trs, newTrainer(t, cfg, url, r/cfg.MP, r%cfg.MP))
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

// expected is what `mmfeed shard` writes for the same input, config and epoch:
// rows by (step, dp rank, micro-batch), the plan, and samples seen.
type expected struct {
	plan  *balancer.Plan
	rows  map[[3]int][]proto.Row
	seen  int
	steps int
}

func shardExpectation(t testing.TB, cfg Config, epoch int) expected {
	t.Helper()
	pc := cfg.Pipeline
	pc.Plan.Epoch = epoch
	prep, err := pipeline.Prepare(context.Background(), pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prep.Close()
	plan, err := prep.Plan(pc.Plan.Strategy)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := pipeline.WriteShards(context.Background(), prep, plan, dir, nil); err != nil {
		t.Fatal(err)
	}
	ex := expected{plan: plan, rows: map[[3]int][]proto.Row{}, seen: int(prep.Seen()), steps: len(plan.Steps)}
	for r := range pc.Plan.DP {
		f, err := os.Open(dir + "/" + pipeline.RankFile(r))
		if err != nil {
			t.Fatal(err)
		}
		rd, err := ipc.NewFileReader(f)
		if err != nil {
			t.Fatal(err)
		}
		for i := range rd.NumRecords() {
			rec, err := rd.RecordBatch(i)
			if err != nil {
				t.Fatal(err)
			}
			_, rows, err := proto.ReadRows(rec)
			if err != nil {
				t.Fatal(err)
			}
			step, mb := i/pc.Plan.MicroBatches, i%pc.Plan.MicroBatches
			ex.rows[[3]int{step, r, mb}] = cloneRows(rows)
		}
		rd.Close()
		f.Close()
	}
	return ex
}

// project keeps the columns modality m carries, as ReadRows returns them.
func project(m proto.Modality, rows []proto.Row) []proto.Row {
	out := make([]proto.Row, len(rows))
	for i, r := range rows {
		if m == proto.ModalityVision {
			r.InputIDs, r.TextTokens = nil, 0
		}
		if m == proto.ModalityText {
			r.Pixels, r.PixelShape, r.ImageTokens = nil, [3]int32{}, 0
		}
		out[i] = r
	}
	return out
}

// checkDelivery compares what the trainers applied in epoch with the shard
// expectation: every batch of every rank, equal rows (ids, tokens, tensors).
func checkDelivery(t testing.TB, cfg Config, trs []*trainer, epoch int, ex expected) {
	t.Helper()
	if ex.steps == 0 {
		t.Fatal("the plan has no steps: the test would check nothing")
	}
	for _, tr := range trs {
		mod, _ := proto.ModalityFor(cfg.layout().Placement, cfg.MP, tr.mp)
		n := 0
		for k := range tr.applied {
			if k.Epoch == epoch {
				n++
			}
		}
		if want := ex.steps * cfg.Pipeline.Plan.MicroBatches; n != want {
			t.Errorf("rank %d.%d applied %d batches of epoch %d, want steps × micro-batches = %d", tr.dp, tr.mp, n, epoch, want)
		}
		for step := range ex.steps {
			for mb := range cfg.Pipeline.Plan.MicroBatches {
				k := proto.BatchKey{Job: cfg.Job, Epoch: epoch, Step: step, MicroBatch: mb, DPRank: tr.dp, MPRank: tr.mp}
				got, ok := tr.applied[k]
				if !ok {
					t.Errorf("rank %d.%d: %v never applied", tr.dp, tr.mp, k)
					continue
				}
				want := project(mod, ex.rows[[3]int{step, tr.dp, mb}])
				if !reflect.DeepEqual(normRows(got), normRows(want)) {
					t.Errorf("%v: rows differ from the shard's (got %d rows %v, want %d rows %v)", k, len(got), ids(got), len(want), ids(want))
				}
			}
		}
	}
}

// normRows maps empty slices to nil so that DeepEqual compares content.
func normRows(rows []proto.Row) []proto.Row {
	out := make([]proto.Row, len(rows))
	for i, r := range rows {
		if len(r.InputIDs) == 0 {
			r.InputIDs = nil
		}
		if len(r.Pixels) == 0 {
			r.Pixels = nil
		}
		out[i] = r
	}
	return out
}

func ids(rows []proto.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

// realOnce checks every planned sample was applied exactly once with weight
// 1 (over the mp-rank-0 trainers) and that planned + dropped + quarantined =
// seen.
func realOnce(t testing.TB, trs []*trainer, epoch int, ex expected, quarantined int) {
	t.Helper()
	count := map[string]int{}
	for _, tr := range trs {
		if tr.mp != 0 {
			continue
		}
		for k, rows := range tr.applied {
			if k.Epoch != epoch {
				continue
			}
			for _, r := range rows {
				if r.Weight > 0 {
					count[r.ID]++
				}
			}
		}
	}
	var dup []string
	for id, n := range count {
		if n != 1 {
			dup = append(dup, id+":"+strconv.Itoa(n))
		}
	}
	sort.Strings(dup)
	if len(dup) > 0 {
		t.Errorf("epoch %d: samples applied more than once: %v", epoch, dup)
	}
	if got := len(count) + len(ex.plan.Dropped) + quarantined; got != ex.seen {
		t.Errorf("epoch %d: applied %d + dropped %d + quarantined %d = %d, want seen %d", epoch, len(count), len(ex.plan.Dropped), quarantined, got, ex.seen)
	}
}

// quarantinedIDs returns the distinct ids of an epoch's quarantine file.
func quarantinedIDs(t testing.TB, dir string, epoch int) map[string]bool {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("%s/quarantine-e%d.jsonl", dir, epoch))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rj, err := loader.ReadQuarantine(f)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, r := range rj {
		out[r.ID] = true
	}
	return out
}

func itoa(i int) string { return strconv.Itoa(i) }

func errorf(format string, a ...any) error { return fmt.Errorf(format, a...) }

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
