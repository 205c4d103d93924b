package work

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/internal/ctxutil"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// WorkerConfig configures a preprocessing worker (RunWorker).
type WorkerConfig struct {
	// NATS is the deployment to connect to: its URLs and credentials (an
	// embedded server is not started for a worker).
	NATS natsenv.Config
	// Slots is how many items the worker preprocesses at once, one core
	// each (0: GOMAXPROCS).
	Slots int
	// CacheDir holds the tokenizer files fetched from the jobs' work buckets
	// ("": a temporary folder, removed at the end).
	CacheDir string
	// Logger receives the worker's log (nil: slog.Default()).
	Logger *slog.Logger

	// Conn, when set, is used instead of connecting (local workers of a
	// planner); the worker does not close it.
	Conn *nats.Conn
	// BeforeSend, when set (tests), is called with each item before its
	// results are sent; an error ends the worker without acknowledging the
	// item (a worker killed mid-item).
	BeforeSend func(*BatchItem) error
	// BuildDelay (tests) is added to each batch item's measured build time:
	// a slow worker.
	BuildDelay time.Duration
}

// Worker pulls batch items from the work queue and preprocesses them.
type Worker struct {
	cfg      WorkerConfig
	log      *slog.Logger
	nc       *nats.Conn
	js       jetstream.JetStream
	ackWait  time.Duration
	chunk    int
	cacheDir string
	slots    int // items at once: told to the planner with each result

	// refused are the subjects the server refused this worker's own
	// connection (a job-scoped credential).
	refused refusals

	mu       sync.Mutex
	datasets map[string]*workerDataset // by job + config hash
	opening  map[string]*sync.Mutex
}

// RunWorker runs a preprocessing worker until ctx ends: it waits for the
// work queue to exist (a planner creates it), then takes batch items of any
// job, builds their rows with the job's preprocessing config (fetched once
// per config from the job's work bucket; the dataset must be readable at the
// path the planner names), encodes one record batch per mp rank and sends
// them to the job's planner, and acknowledges the item once the planner has
// them. While it works on an item it renews the item's ack deadline until
// the item's own deadline; a worker that dies leaves the item to be
// redelivered to another worker after the queue's ack wait.
func RunWorker(ctx context.Context, cfg WorkerConfig) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Conn == nil && !cfg.NATS.External() {
		return fmt.Errorf("serve: a worker needs --nats URL: %w", natsenv.ErrInvalidConfig)
	}
	if cfg.Conn == nil {
		if cfg.NATS.ReconnectWait <= 0 {
			cfg.NATS.ReconnectWait = 250 * time.Millisecond
		}
		if err := cfg.NATS.Validate(); err != nil {
			return err
		}
	}
	w := newWorker(cfg, log)
	nc := cfg.Conn
	if nc == nil {
		var err error
		nc, err = natsenv.Connect(cfg.NATS, nil, nil, log, nats.CustomInboxPrefix(WorkerInboxPrefix),
			nats.Timeout(10*time.Second), nats.ErrorHandler(w.refused.handler(log)))
		if err != nil {
			return err
		}
		defer nc.Close()
	}
	defer w.Close()
	err := w.attach(nc)
	if err != nil {
		return err
	}
	if w.cacheDir = cfg.CacheDir; w.cacheDir == "" {
		if w.cacheDir, err = os.MkdirTemp("", "mmfeed-worker-"); err != nil {
			return fmt.Errorf("serve: worker cache: %w", err)
		}
		defer os.RemoveAll(w.cacheDir)
	}
	cons, err := w.WaitForQueue(ctx)
	if err != nil {
		return err
	}
	slots := cfg.Slots
	if slots <= 0 {
		slots = runtime.GOMAXPROCS(0)
	}
	w.slots = slots
	log.Info("worker ready", "slots", slots, "ack_wait", w.ackWait)
	g, gctx := errgroup.WithContext(ctx)
	for range slots {
		g.Go(func() error { return w.loop(gctx, cons) })
	}
	err = g.Wait()
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func newWorker(cfg WorkerConfig, log *slog.Logger) *Worker {
	return &Worker{cfg: cfg, log: log, datasets: map[string]*workerDataset{}, opening: map[string]*sync.Mutex{}}
}

// attach sets the worker's connection (which its caller closes).
func (w *Worker) attach(nc *nats.Conn) error {
	w.nc = nc
	var err error
	if w.js, err = jetstream.New(nc); err != nil {
		return fmt.Errorf("serve: jetstream: %w", err)
	}
	if w.chunk, err = proto.ChunkSize(nc.MaxPayload()); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// Attach returns a worker on nc that takes no items by itself: its
// caller (a test's forger) takes them from the queue (WaitForQueue), builds
// and sends them (Build, Send) and closes it (Close); tokenizer files are
// cached in cacheDir.
func Attach(nc *nats.Conn, log *slog.Logger, cacheDir string) (*Worker, error) {
	w := newWorker(WorkerConfig{CacheDir: cacheDir}, log)
	w.cacheDir = cacheDir
	return w, w.attach(nc)
}

// WaitForQueue returns the workers' consumer once a planner has created it.
func (w *Worker) WaitForQueue(ctx context.Context) (jetstream.Consumer, error) {
	logged := false
	for {
		cons, err := w.js.Consumer(ctx, Stream, Consumer)
		if err == nil {
			w.ackWait = cons.CachedInfo().Config.AckWait
			return cons, nil
		}
		if !logged {
			w.log.Info("waiting for a planner to create the work queue", "err", err)
			logged = true
		}
		t := time.NewTimer(500 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// Close closes the worker's datasets (not its connection).
func (w *Worker) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, d := range w.datasets {
		_ = d.ds.Close()
		delete(w.datasets, k)
	}
}

// loop takes one item at a time until ctx ends or the worker is killed.
func (w *Worker) loop(ctx context.Context, cons jetstream.Consumer) error {
	for ctx.Err() == nil {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			w.log.Warn("work queue fetch", "err", err)
			if err := ctxutil.Sleep(ctx, time.Second); err != nil {
				return err
			}
			continue
		}
		for m := range batch.Messages() {
			if err := w.handle(ctx, m); err != nil {
				return err
			}
		}
	}
	return ctx.Err()
}

// ErrKilled ends a worker without acknowledging its item (tests).
var ErrKilled = errors.New("worker killed")

// handle processes one queue message. Only a kill (tests) is returned:
// every other failure is logged and the item left to another attempt.
func (w *Worker) handle(ctx context.Context, m jetstream.Msg) error {
	var kind struct{ Kind string }
	if json.Unmarshal(m.Data(), &kind) == nil && kind.Kind == "features" {
		return w.handleFeatures(ctx, m)
	}
	var it BatchItem
	if err := json.Unmarshal(m.Data(), &it); err != nil || it.validate() != nil {
		if err == nil {
			err = it.validate()
		}
		w.log.Warn("bad work item: dropped", "subject", m.Subject(), "err", err)
		_ = m.Term()
		return nil
	}
	if w.leaveRefused(m, it.Job, it.ID) {
		return nil
	}
	t0 := time.Now()
	hctx, stop := context.WithCancel(ctx)
	defer stop()
	go w.renew(hctx, m, t0.Add(time.Duration(it.DeadlineMS)*time.Millisecond))
	payloads, took, err := w.Build(ctx, &it)
	if err != nil {
		if ctx.Err() != nil {
			_ = m.Nak() // stopping: the item goes to another worker at once
			return ctx.Err()
		}
		if w.leaveRefused(m, it.Job, it.ID) {
			w.log.Warn("the server refuses this worker's credential the job: its items are left to other workers", "job", it.Job, "err", err)
			return nil
		}
		w.log.Warn("work item failed: left for another attempt", "item", it.ID, "epoch", it.Epoch, "step", it.Step,
			"dp", it.DP, "mb", it.MicroBatch, "err", err)
		_ = m.NakWithDelay(2 * time.Second)
		return w.reportFailure(ctx, ResultSubject(it.Job), it.ID, err)
	}
	if w.cfg.BeforeSend != nil {
		if err := w.cfg.BeforeSend(&it); err != nil {
			return ErrKilled
		}
	}
	if err := w.Send(ctx, &it, payloads, took); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if w.leaveRefused(m, it.Job, it.ID) {
			w.log.Warn("the server refuses this worker's credential the job's results: its items are left to other workers", "job", it.Job, "err", err)
			return nil
		}
		if errors.Is(err, ErrRejected) { // the planner issued the item again: this copy is done
			w.log.Warn("work result rejected by the planner (it issues the item again)", "item", it.ID, "err", err)
			_ = m.Ack()
			return nil
		}
		w.log.Warn("work result not taken: left for another attempt", "item", it.ID, "err", err)
		_ = m.Nak()
		return nil
	}
	stop()
	if err := m.Ack(); err != nil {
		w.log.Debug("work item ack", "item", it.ID, "err", err) // the planner has the result
	}
	return nil
}

// renew keeps the item to this worker (InProgress) every third of the ack
// wait until its deadline: past it, the item is redelivered to another
// worker too, and the first result wins.
func (w *Worker) renew(ctx context.Context, m jetstream.Msg, deadline time.Time) {
	t := time.NewTicker(max(w.ackWait/3, 50*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if now.After(deadline) {
				return
			}
			_ = m.InProgress()
		}
	}
}

// Build preprocesses the item's samples and encodes one payload per mp
// rank; took is the time that took (opening the dataset left out).
func (w *Worker) Build(ctx context.Context, it *BatchItem) (_ [][]byte, took time.Duration, err error) {
	ds, release, err := w.dataset(ctx, it.Job, it.Config)
	if err != nil {
		return nil, 0, err
	}
	defer release()
	t0 := time.Now()
	rows := make([]proto.Row, len(it.Samples))
	for i, s := range it.Samples {
		j, ok := ds.entry(s.ID)
		if !ok {
			return nil, 0, fmt.Errorf("serve: sample %q is not in this worker's index of %s (is the dataset the planner's?): %w",
				s.ID, ds.ds.Config.InputName(), ErrJobMismatch)
		}
		rows[i] = ds.pp.EpochRow(ctx, it.Epoch, ds.ds.Index.Entry(j), s.row())
	}
	if w.cfg.BuildDelay > 0 {
		if err := ctxutil.Sleep(ctx, w.cfg.BuildDelay); err != nil {
			return nil, 0, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	mem := memory.NewGoAllocator()
	out := make([][]byte, len(it.Metas))
	for mp, meta := range it.Metas {
		if out[mp], _, _, err = EncodeRows(mem, meta, rows); err != nil {
			return nil, 0, err
		}
	}
	return out, time.Since(t0), nil
}

// Send sends the payloads in chunks to the job's result subject, then asks
// the planner (on the same subject, so after the chunks) whether it holds
// them.
func (w *Worker) Send(ctx context.Context, it *BatchItem, payloads [][]byte, took time.Duration) error {
	subj := ResultSubject(it.Job)
	for mp, p := range payloads {
		msgs, err := proto.ChunkSum(it.Metas[mp].Key(), 0, p, proto.Checksum(p), w.chunk)
		if err != nil {
			return err
		}
		for _, msg := range msgs {
			msg.Subject = subj
			msg.Header.Set(HdrItem, it.ID)
			msg.Header.Set(HdrConfig, it.Config)
			if err := w.nc.PublishMsg(msg); err != nil {
				return err
			}
		}
	}
	done := nats.NewMsg(subj)
	done.Header.Set(HdrDone, it.ID)
	done.Header.Set(HdrItem, it.ID)
	done.Header.Set(HdrSeconds, strconv.FormatFloat(took.Seconds(), 'f', 6, 64))
	done.Header.Set(HdrSlots, strconv.Itoa(w.slots))
	reply, err := w.askPlanner(ctx, done)
	if err != nil {
		return fmt.Errorf("serve: result of %s: %w", it.ID, err)
	}
	return plannerAnswer(reply, it.ID)
}

// ErrRejected: the planner rejected this worker's result of an item (it
// does not match the item) and issued the item again.
var ErrRejected = errors.New("result rejected by the planner")

// errInput marks a worker's failure to read a job's input: its dataset
// does not open here (the planner's path is not reachable from this
// machine), or it is another dataset than the planner's (ErrJobMismatch).
var errInput = errors.New("the job's input cannot be read on this worker")

// failPause is how long a worker slot whose item failed on its input waits
// before it takes another: such a worker fails at once, and without the
// pause it would take the item back (after its nak delay) before the
// workers that can read the input.
const failPause = 5 * time.Second

// reportFailure tells the job's planner why this worker could not build an
// item, when the cause is the job's input (errInput, ErrJobMismatch), so
// that the planner can say why its items fail and give up on one that
// fails on every attempt (HdrError on subj, no payload), then pauses
// the slot (failPause). Other failures (a JetStream request that timed out
// while a stream elects its leader, ...) are left to the retries.
func (w *Worker) reportFailure(ctx context.Context, subj, id string, err error) error {
	if !errors.Is(err, errInput) && !errors.Is(err, ErrJobMismatch) {
		return nil
	}
	msg := nats.NewMsg(subj)
	msg.Header.Set(HdrItem, id)
	msg.Header.Set(HdrError, Truncate(strings.ReplaceAll(err.Error(), "\n", " "), MaxReasonBytes))
	if perr := w.nc.PublishMsg(msg); perr != nil {
		w.log.Debug("failure report", "item", id, "err", perr)
	}
	return ctxutil.Sleep(ctx, failPause)
}

// handleFeatures computes the features of a feature item's index range and
// sends them to the planner.
func (w *Worker) handleFeatures(ctx context.Context, m jetstream.Msg) error {
	var it FeatureItem
	if err := json.Unmarshal(m.Data(), &it); err != nil || it.ID == "" || proto.ValidateJob(it.Job) != nil {
		w.log.Warn("bad feature item: dropped", "subject", m.Subject(), "err", err)
		_ = m.Term()
		return nil
	}
	if w.leaveRefused(m, it.Job, it.ID) {
		return nil
	}
	hctx, stop := context.WithCancel(ctx)
	defer stop()
	go w.renew(hctx, m, time.Now().Add(time.Duration(it.DeadlineMS)*time.Millisecond))
	err := w.features(ctx, &it)
	if errors.Is(err, ErrRejected) { // the planner issued the item again: this copy is done
		w.log.Warn("feature result rejected by the planner (it issues the item again)", "item", it.ID, "err", err)
		err = nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if w.leaveRefused(m, it.Job, it.ID) {
			w.log.Warn("the server refuses this worker's credential the job: its items are left to other workers", "job", it.Job, "err", err)
			return nil
		}
		w.log.Warn("feature item failed: left for another attempt", "item", it.ID, "lo", it.Lo, "hi", it.Hi, "err", err)
		_ = m.NakWithDelay(2 * time.Second)
		return w.reportFailure(ctx, FeaturesSubject(it.Job), it.ID, err)
	}
	stop()
	_ = m.Ack()
	return nil
}

func (w *Worker) features(ctx context.Context, it *FeatureItem) error {
	ds, release, err := w.dataset(ctx, it.Job, it.Config)
	if err != nil {
		return err
	}
	defer release()
	ix := ds.ds.Index
	if it.Lo < 0 || it.Hi > ix.Len() || it.Lo >= it.Hi || ix.ID(it.Lo) != it.FirstID || ix.ID(it.Hi-1) != it.LastID {
		return fmt.Errorf("serve: feature range [%d, %d) does not match this worker's index of %s (%d entries): %w",
			it.Lo, it.Hi, ds.ds.Config.Input, ix.Len(), ErrJobMismatch)
	}
	feats, err := pipeline.FeaturesRange(ctx, ix, it.Lo, it.Hi, ds.ds.Tokenizer, ds.ds.Config.Image)
	if err != nil {
		return err
	}
	b, err := json.Marshal(feats)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(FeaturesSubject(it.Job))
	msg.Header.Set(HdrItem, it.ID)
	msg.Data = b
	reply, err := w.askPlanner(ctx, msg)
	if err != nil {
		return fmt.Errorf("serve: feature result of %s: %w", it.ID, err)
	}
	return plannerAnswer(reply, it.ID)
}

// The planner answers a worker's result request within milliseconds (after
// the item's chunks, which are on the same subject); askAttempt bounds one
// attempt, askAttempts the attempts.
const (
	askAttempt  = 2 * time.Second
	askAttempts = 5
)

// askPlanner sends a result request to the job's planner and returns its
// answer. No responders (no planner: the leader died and no standby leads
// yet) fails at once, leaving the item to the queue. An attempt without an
// answer is sent again: a planner killed after receiving the request never
// answers it, and waiting out one long timeout would hold this slot while
// the standby that took over waits for workers (the ~7 s extra takeover
// delay test_cluster_roles.py measured); a slow planner answers the
// retry, and answers to an attempt given up are dropped with its inbox. The
// planner's handlers are idempotent (the first result of an item wins).
func (w *Worker) askPlanner(ctx context.Context, msg *nats.Msg) (*nats.Msg, error) {
	var err error
	for range askAttempts {
		rctx, cancel := context.WithTimeout(ctx, askAttempt)
		var reply *nats.Msg
		reply, err = w.nc.RequestMsgWithContext(rctx, &nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data})
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			return reply, err
		}
		w.log.Debug("no answer from the planner: asking again", "subject", msg.Subject, "err", err)
	}
	return nil, err
}

// plannerAnswer is nil when the planner took item id's result (AnswerOK),
// ErrRejected when it rejected it, and an error naming any other answer.
func plannerAnswer(reply *nats.Msg, id string) error {
	s := string(reply.Data)
	switch {
	case s == AnswerOK:
		return nil
	case strings.HasPrefix(s, AnswerRejected):
		return fmt.Errorf("serve: %s: %w", s, ErrRejected)
	}
	return fmt.Errorf("serve: the planner answered %q for %s", s, id)
}
