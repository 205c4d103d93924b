package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline/serve/control"
	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/produce"
	"github.com/mmfeed/mmfeed/pipeline/serve/report"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// Service is one running `mmfeed serve`. Create it with New, then call Run
// once. It composes parts that each own their state and lock (doc.go,
// "Ownership and concurrency"); the fields outside them are set before Run
// starts its goroutines (New, startNATS, setup) and only read after.
type Service struct {
	cfg Config
	log *slog.Logger
	reg *prometheus.Registry
	met *metrics
	mem memory.Allocator // the Arrow records' (Config.Allocator)

	// The parts.
	ranks     *deliver.Ranks              // the ranks' positions and their KV records (package deliver)
	epochs    *epochs.Book                // the epochs' infos, plans and preparations (package epochs)
	data      *jobDataset                 // the dataset, opened once and shared by the epochs (dataset.go)
	publisher *deliver.Publisher          // the publish loop's shared state (deliver/publisher.go)
	ctl       *control.Control            // the trainers' control messages (package control)
	replies   *control.Guard              // every request's reply subject is checked here (package control)
	rlog      *control.RateLog            // refusals and other floods: at most one line per kind a second
	tasks     tasks                       // the goroutines started for a message (tasks.go)
	cal       *calibrator                 // trainer feedback to cost models (calibrate.go)
	live      *report.State               // the live report (package report)
	health    health                      // what /healthz reports beyond the connection
	fence     func(context.Context) error // the lease's Await before every state write (natsenv.Guard)
	// plane is the data plane (package deliver), chosen in New (plane.go).
	plane deliver.DataPlane
	// resize is a dp change accepted at start (resize.go); nil when none.
	resize *pendingResize
	// work is the planner role's work queue side (nil with role all).
	work *work.Planner
	// produce is the publish loop (produceglue.go), created by prepare.
	produce *produce.Producer
	// newJob is a new job's record until it is written (recordJob).
	newJob atomic.Pointer[JobRecord]
	// truncWarn logs the captions truncated at MaxLength once (epochs.WarnTruncation).
	truncWarn sync.Once

	// Connections and JetStream assets, set up before Run starts its parts.
	ns         *server.Server
	nc         *nats.Conn
	js         jetstream.JetStream
	st         state
	quarantine *work.QuarantineSink // quarantined samples to the job's quarantine bucket

	ready     chan struct{}
	clientURL string
	httpAddr  string
}

// New validates cfg and returns a Service that has not started anything.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("job", cfg.Job)
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	mem := cfg.Allocator
	if mem == nil {
		mem = memory.DefaultAllocator
	}
	s := &Service{cfg: cfg, log: log, reg: reg, mem: mem, ready: make(chan struct{}), publisher: deliver.NewPublisher(), live: report.NewState(cfg.Pipeline.Plan.DP, cfg.MP, cfg.Pipeline.Plan.Placement)}
	s.epochs = epochs.NewBook(s.planEpoch, kvStore{&s.st})
	s.data = newJobDataset()
	s.ranks = deliver.NewRanks(cfg.ranks(), cfg.MP, s.epochs, kvStore{&s.st})
	s.plane = newDataPlane(s)
	s.cal = newCalibrator(cfg)
	s.cal.onFit = s.writeCostModel
	s.met = newMetrics(s)
	if err := s.met.register(reg); err != nil {
		return nil, fmt.Errorf("serve: metrics: %w", err)
	}
	s.setupControl()
	return s, nil
}

// Run serves the job with cfg until every epoch is published (and, with
// WaitForTrainers, every rank has completed it), ctx ends, or a part fails.
func Run(ctx context.Context, cfg Config) error {
	s, err := New(cfg)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

// Ready is closed once NATS, the stream, the consumers, the control handlers
// and the HTTP server are up.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// ClientURL is the NATS URL trainers connect to (after Ready): the embedded
// server's listen address, or the external URLs. "" with an in-process-only
// embedded server.
func (s *Service) ClientURL() string { return s.clientURL }

// HTTPAddr is the HTTP server's address (after Ready), "" without one.
func (s *Service) HTTPAddr() string { return s.httpAddr }

// DialInProcess connects a client to the embedded server in process (after
// Ready), for consumers running in the same process (bench/). It fails
// with an external deployment (connect to ClientURL there).
func (s *Service) DialInProcess(opts ...nats.Option) (*nats.Conn, error) {
	if s.ns == nil {
		return nil, fmt.Errorf("serve: no embedded server to dial in process: %w", ErrInvalidConfig)
	}
	return nats.Connect("", append([]nats.Option{nats.InProcessServer(s.ns)}, opts...)...)
}

// Registry is the Prometheus registry the service's metrics are in.
func (s *Service) Registry() *prometheus.Registry { return s.reg }

// Run starts the parts, supervises them together and drains on the way out:
// the first part to fail (or ctx) stops the others.
func (s *Service) Run(ctx context.Context) error {
	defer s.data.close() // after the epochs that share it
	defer s.epochs.CloseAll()
	ro, err := s.openReportOut()
	if err != nil {
		return err
	}
	s.tasks.open(ctx)
	if err := s.startNATS(ctx); err != nil {
		s.tasks.close()
		return err
	}
	defer s.stopNATS()
	defer s.tasks.close() // after the handlers are unsubscribed, before NATS stops
	ls, err := natsenv.OpenLease(ctx, s.js, s.cfg.Job, s.cfg.LeaseTTL, s.cfg.Replicas, s.log)
	if err != nil {
		return err
	}
	if err := ls.Acquire(ctx); err != nil {
		return nil // stopped while standing by
	}
	// The handlers' tasks end before the lease goes (a fetch records its batch
	// as handed before sending it: one still running after the release could
	// send a batch the standby never learns of), and writes after it are refused.
	defer func() {
		s.tasks.close()
		ls.Release()
	}()
	s.fence = ls.Await
	var subs subscriptions
	defer subs.unsubscribe()
	if err := s.prepare(ctx, &subs); err != nil {
		return err
	}
	if ro != nil {
		defer ro.atExit(s) // after the parts stopped, before the epochs close
	}
	return s.runResult(ctx, s.supervise(ctx, ls, ro, &subs))
}

// subscriptions are the service's NATS subscriptions, unsubscribed when Run
// returns.
type subscriptions []*nats.Subscription

func (subs *subscriptions) unsubscribe() {
	for _, sub := range *subs {
		_ = sub.Unsubscribe()
	}
}

// prepare sets up the feature cache, the job's JetStream assets and state,
// the work queue (planner role) and the control handlers, whose
// subscriptions it adds to subs.
func (s *Service) prepare(ctx context.Context, subs *subscriptions) error {
	if err := s.setupFeatureCache(); err != nil {
		return err
	}
	if err := s.setup(ctx); err != nil {
		return err
	}
	if s.cfg.Role == RolePlanner { // before a register can start planning
		wsubs, err := s.setupWork(ctx)
		*subs = append(*subs, wsubs...)
		if err != nil {
			return err
		}
	}
	s.produce = s.newProducer()
	csubs, err := s.ctl.Subscribe(s.nc)
	*subs = append(*subs, csubs...)
	return err
}

// supervise runs the parts in one errgroup with ctx until the publisher
// finishes or a part fails, then records the positions the last acks moved.
// When the data subscriptions or the HTTP listener fail, the parts already
// started are stopped and waited for before it returns.
func (s *Service) supervise(ctx context.Context, ls *natsenv.Lease, ro *reportOut, subs *subscriptions) error {
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	g, gctx := errgroup.WithContext(pctx)
	s.startParts(g, gctx, ls, ro)
	abort := func(err error) error {
		stop()
		_ = g.Wait()
		return err
	}
	dsubs, err := s.plane.Subscribe(gctx)
	if err != nil {
		return abort(err)
	}
	*subs = append(*subs, dsubs...)
	if err := s.startHTTP(g, gctx); err != nil {
		return abort(err)
	}
	close(s.ready)
	s.log.Info("serving", "nats", s.clientURL, "http", s.httpAddr, "dp", s.cfg.Pipeline.Plan.DP, "mp", s.cfg.MP,
		"epochs", s.cfg.Epochs)
	s.startPublisher(g, gctx)
	err = g.Wait()
	// The positions moved since the last write, before the lease goes: the
	// last acks of a finished job, or of a drain.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	if ferr := s.ranks.FlushPositions(fctx); ferr != nil {
		s.log.Warn("record rank positions", "err", ferr)
	}
	cancel()
	return err
}

// startParts starts the lease renewal, the local workers, the progress
// log, the positions log, the report writer, the asset watch and the
// stream poll in g.
func (s *Service) startParts(g *errgroup.Group, gctx context.Context, ls *natsenv.Lease, ro *reportOut) {
	g.Go(func() error { return ls.Hold(gctx, s.cfg.GiveUpAfter) })
	if s.cfg.LocalWorkers > 0 {
		g.Go(func() error {
			return work.RunWorker(gctx, work.WorkerConfig{Conn: s.nc, Slots: s.cfg.LocalWorkers, Logger: s.log.With("role", "local-worker")})
		})
	}
	g.Go(func() error { s.logProgress(gctx, s.cfg.ProgressEvery); return nil })
	g.Go(func() error { s.ranks.RunPositions(gctx, deliver.PositionInterval); return nil })
	if ro != nil {
		g.Go(func() error { s.reportLoop(gctx, ro); return nil })
	}
	g.Go(func() error { return s.watchAssets(gctx) })
	g.Go(func() error { return s.plane.Run(gctx) })
}

// startHTTP listens on Config.HTTP (when set) and serves the handler in g
// until gctx ends, then shuts the server down within 5 s.
func (s *Service) startHTTP(g *errgroup.Group, gctx context.Context) error {
	if s.cfg.HTTP == "" {
		return nil
	}
	h := s.newHTTP()
	ln, err := h.Listen()
	if err != nil {
		return fmt.Errorf("serve: http listen %s: %w", s.cfg.HTTP, err)
	}
	s.httpAddr = ln.Addr().String()
	g.Go(func() error {
		if err := h.Serve(ln); err != nil {
			return fmt.Errorf("serve: http: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return h.Shutdown(sctx)
	})
	return nil
}

// startPublisher runs the publish loop in g; its end stops the group
// (errFinished).
func (s *Service) startPublisher(g *errgroup.Group, gctx context.Context) {
	done := make(chan struct{})
	g.Go(func() error {
		defer close(done)
		return s.produce.Run(gctx)
	})
	g.Go(func() error {
		select {
		case <-done: // the publisher finished: stop the rest
			return errFinished
		case <-gctx.Done():
			return nil
		}
	})
}

// runResult is what Run returns for the group's err: nil once everything
// is published, and on a drain (SIGINT/SIGTERM: ctx canceled).
func (s *Service) runResult(ctx context.Context, err error) error {
	if errors.Is(err, errFinished) {
		return nil
	}
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		s.log.Info("stopped", "reason", context.Cause(ctx))
		return nil // a clean drain
	}
	return err
}

// errFinished stops the supervision group when the publisher is done.
var errFinished = errors.New("finished")

// startNATS starts the embedded server (or not, with an external
// deployment) and connects the service: within ctx, and when ctx ends
// first the server is stopped and the error wraps ctx's.
func (s *Service) startNATS(ctx context.Context) error {
	nc := s.cfg.NATS
	var sec *natsenv.Security
	if !nc.External() {
		pass, err := natsenv.RandomSecret()
		if err != nil {
			return err
		}
		sec = &natsenv.Security{Insecure: s.cfg.Insecure, ServicePass: pass}
		ns, err := natsenv.StartEmbedded(ctx, nc, sec)
		if err != nil {
			return err
		}
		s.ns = ns
		if nc.Listen != "" {
			s.clientURL = ns.ClientURL()
		}
	} else {
		s.clientURL = natsenv.Redact(joinURLs(nc.URLs))
	}
	// Per-user permissions scope each credential's inbox: replies must go there.
	s.replies.SetStrict(sec.PerUser())
	conn, err := natsenv.Connect(nc, s.ns, sec, s.log, nats.CustomInboxPrefix(ServiceInboxPrefix))
	if err != nil {
		s.stopNATS()
		return err
	}
	s.nc = conn
	if s.js, err = jetstream.New(conn); err != nil {
		s.stopNATS()
		return fmt.Errorf("serve: jetstream: %w", err)
	}
	if err := ctx.Err(); err != nil { // ended while connecting: nothing stays up
		s.stopNATS()
		return fmt.Errorf("serve: nats: %w", err)
	}
	return nil
}

func (s *Service) stopNATS() {
	if s.nc != nil {
		_ = s.nc.Drain()
		deadline := time.Now().Add(5 * time.Second)
		for !s.nc.IsClosed() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		s.nc.Close()
	}
	if s.ns != nil {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
	}
}

// setup creates the KV bucket and, on the JetStream data plane, the stream
// and every rank's consumer (on the core data plane, the outbox), checks the
// job record and restores the ranks' positions.
func (s *Service) setup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c := s.cfg
	kv, err := c.assets().EnsureState(ctx, s.js)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	s.st = state{natsenv.Guard(kv, s.fence, s.stored)}
	qkv, err := c.assets().EnsureQuarantine(ctx, s.js)
	if err != nil {
		return fmt.Errorf("serve: quarantine bucket: %w", err)
	}
	s.quarantine = work.NewQuarantineSink(qkv, s.log, true)
	if err := s.plane.Setup(ctx); err != nil {
		return err
	}
	if err := s.checkJob(ctx); err != nil {
		return err
	}
	return s.restore(ctx)
}

// checkJob compares the KV job record with this configuration and writes it.
func (s *Service) checkJob(ctx context.Context) error {
	rec, err := s.cfg.jobRecord()
	if err != nil {
		return err
	}
	var stored JobRecord
	ok, err := s.st.getJSON(ctx, proto.KVConfig, &stored)
	if err != nil {
		return err
	}
	if !ok { // a new job: recorded once its dataset opened (recordJob), so a wrong --input leaves no record
		s.newJob.Store(&rec)
		return nil
	}
	pending, err := s.checkResize(rec, stored)
	if err != nil || pending {
		return err // a pending resize writes the record once it is decided
	}
	if err := rec.compatible(stored); err != nil {
		return err
	}
	return s.st.putJSON(ctx, proto.KVConfig, rec)
}

// recordJob writes a new job's record (checkJob) once; planEpoch calls it
// after the dataset opened, before the first epoch's info is written.
func (s *Service) recordJob(ctx context.Context) error {
	rec := s.newJob.Load()
	if rec == nil {
		return nil
	}
	if err := s.st.putJSON(ctx, proto.KVConfig, *rec); err != nil {
		return err
	}
	s.newJob.CompareAndSwap(rec, nil)
	return nil
}

// restore reads the epochs planned so far, each rank's generation and last
// completed step, and sets each rank's publish cursor after the last batch
// still stored for it (or at its trainer's next step when none is).
func (s *Service) restore(ctx context.Context) error {
	first := proto.Pos{Epoch: s.cfg.Pipeline.Plan.Epoch, Step: 0}
	for e := first.Epoch; e <= s.cfg.lastEpoch(); e++ {
		var info EpochInfo
		ok, err := s.st.getJSON(ctx, epochs.InfoKey(e), &info)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if err := info.Validate(); err != nil {
			return err
		}
		s.epochs.SetInfo(e, info)
	}
	for r := range s.ranks.Len() {
		rs, err := s.ranks.Load(ctx, r, first)
		if err != nil {
			return err
		}
		cursor, err := s.plane.RestoredCursor(ctx, r, rs.Cursor())
		if err != nil {
			return err
		}
		s.ranks.Set(r, rs.WithCursor(cursor))
	}
	return nil
}

// modelFor returns the model the next epoch starts with: the latest
// calibration when recalibration is on and has enough data, else the
// configured model.
func (s *Service) modelFor() balancer.CostModel {
	if m, ok := s.cal.model(); ok && s.cfg.Recalibrate >= 0 {
		return m
	}
	return s.cfg.Pipeline.Plan.Model
}

func joinURLs(urls []string) string {
	out := ""
	for i, u := range urls {
		if i > 0 {
			out += ","
		}
		out += u
	}
	return out
}
