package serve

import (
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/prometheus/client_golang/prometheus"
)

// Roles of `mmfeed serve`.
const (
	// RoleAll plans and preprocesses in one process (the default).
	RoleAll = "all"
	// RolePlanner plans, issues batch work items and delivers the workers'
	// results to the trainers; it preprocesses nothing itself unless
	// Config.LocalWorkers > 0.
	RolePlanner = "planner"
	// RoleWorker pulls work items of any job and preprocesses them
	// (work.RunWorker); it needs only the NATS deployment.
	RoleWorker = "worker"
)

// Config configures a Service. Every field is documented with its default
// (DefaultConfig).
type Config struct {
	// Pipeline is the dataset, tokenizer, image policy, plan (dp, micro-batches,
	// global batch, placement, strategy, seed) and worker count. Pipeline.Plan.Epoch
	// is the job's first epoch.
	Pipeline pipeline.Config
	// Job names the job: subjects, stream, consumers and KV bucket (proto.ValidateJob).
	Job string
	// MP is the number of model-parallel ranks per dp rank (1). Placement
	// modality needs MP = 2.
	MP int
	// Epochs is how many epochs to serve, from Pipeline.Plan.Epoch (1).
	Epochs int

	// NATS selects the NATS deployment: empty URLs start the embedded server.
	NATS natsenv.Config

	// DataPlane is how payloads travel (proto.DataPlaneCore, the default:
	// core NATS, in memory, each rank asking for its next batches;
	// proto.DataPlaneJetStream: the job's JetStream stream, one durable
	// consumer per rank).
	DataPlane string
	// Role is RoleAll (the default: plan and preprocess here) or
	// RolePlanner (plan here, preprocess on workers: work.RunWorker). A worker is
	// not a Service.
	Role string
	// LocalWorkers is how many items a planner preprocesses itself, as
	// workers in its own process (0: none, every item goes to the
	// work.RunWorker processes).
	LocalWorkers int
	// WorkAckWait is how long a worker may go without renewing an item
	// before the queue redelivers it (2 s): a dead worker's items go to
	// another worker after about this long. Workers renew every third of
	// it, until the item's own deadline (4 × its predicted time + 1 s).
	WorkAckWait time.Duration
	// WorkAhead is how many steps past the one being published a planner
	// issues items for (4): more keeps more workers busy, and holds more
	// results in memory.
	WorkAhead int

	// LeaseTTL is how long the job's leadership lease lives without renewal
	// (5 s): a second service started for the same job stands by and takes
	// over within about this long after the leader dies (at once when it
	// stops cleanly).
	LeaseTTL time.Duration
	// StreamMaxBytes bounds the job's stream (1 GiB), or on the core data
	// plane the service's in-memory outbox: the backpressure bound between
	// preprocessing and trainers.
	StreamMaxBytes int64
	// StreamMemory keeps the stream in memory instead of files (false).
	StreamMemory bool
	// Replicas is the stream and KV replication factor in a cluster (1).
	Replicas int
	// Duplicates is the stream's Nats-Msg-Id dedupe window (2 min).
	Duplicates time.Duration
	// MaxAckPending is each rank consumer's prefetch bound in chunks (1024).
	MaxAckPending int
	// AckWait is each rank consumer's redelivery timeout (5 min).
	AckWait time.Duration
	// Publisher tunes chunk publishing (window, backoff, ack timeout).
	Publisher proto.PublisherConfig

	// Recalibrate selects when the cost model is refit from trainer feedback:
	// 0 at epoch boundaries only, K > 0 also every K published steps (replanning
	// the not-yet-published rest of the epoch), -1 never (0).
	Recalibrate int
	// MinObservations is the fewest rank-step observations a refit needs (16).
	MinObservations int
	// CostModelOut, when set, is rewritten with the cost model after every refit
	// (pipeline.CostModelExport, what --cost-model reads).
	CostModelOut string
	// ReportOut, when set, is a directory that receives the run report
	// (package report; reportglue.go): report-e<epoch>.json and .html when
	// every rank has trained past the epoch, and report-latest.json and .html
	// at each of those and when Run returns (SIGTERM and ctx included).
	// Created if missing.
	ReportOut string

	// NoBaselines leaves the other strategies out of the live report's
	// comparison: each epoch is then planned once, with the job's strategy,
	// instead of once per strategy (the mmfeed search costs seconds per step
	// at a few hundred dp ranks: docs/BENCHMARKS.md, "Control plane at
	// scale").
	NoBaselines bool

	// HTTP is the live report's listen address ("": no HTTP server). The CLI
	// default is 127.0.0.1:8080; a port of 0 picks a free one.
	HTTP string
	// Insecure allows NATS or HTTP to listen on a non-loopback address
	// without authentication (false: refused with ErrInsecure).
	Insecure bool
	// HTTPToken, when set, is required as "Authorization: Bearer <token>" on
	// every endpoint but /healthz.
	HTTPToken string
	// HTTPTLSCert and HTTPTLSKey, when set (both), serve HTTPS instead of
	// HTTP (PEM files; TLS 1.2 at least). Without HTTPToken anyone who can
	// reach the address still reads the report: TLS hides the token and the
	// report on the wire, it does not authenticate the client.
	HTTPTLSCert, HTTPTLSKey string

	// AssetCheck is how often the job's JetStream assets (KV buckets, stream,
	// consumers) are checked and recreated when lost (2 s; 0: never).
	AssetCheck time.Duration
	// StuckAfter is how long assets may stay unreachable, or one publish stay
	// in flight while the stream has room, before the log escalates to
	// errors and /healthz answers 503 for a stuck publish (30 s).
	StuckAfter time.Duration
	// GiveUpAfter ends the service with an error when the assets stay
	// unreachable this long (10 min; 0: never).
	GiveUpAfter time.Duration

	// QuarantineDir receives quarantine-e<epoch>.jsonl files (appended); ""
	// keeps counts only.
	QuarantineDir string
	// WaitForTrainers keeps the service running after the last batch is
	// published until every rank has completed the last step (true); false
	// returns as soon as everything is published.
	WaitForTrainers bool
	// AllowResize lets this service take over a job recorded at another dp
	// (elastic resume, resize.go): the rest of the epoch from the first
	// register's position is replanned for this dp. Core data plane only.
	AllowResize bool
	// RegisterWait bounds how long a register for an epoch still being planned
	// waits before it is answered with ErrNotReady (20 s).
	RegisterWait time.Duration
	// ProgressEvery is how often the service logs the trainers' progress
	// through the epoch with its rate and ETA, when they moved (10 s; 0: off).
	ProgressEvery time.Duration

	// Logger receives the service log (nil: slog.Default()).
	Logger *slog.Logger
	// Registry receives the Prometheus metrics (nil: a fresh registry, served
	// on /metrics).
	Registry *prometheus.Registry
	// Allocator allocates the Arrow records the service builds (the
	// batches it publishes and the viewers' copies); each is released once
	// encoded (nil: memory.DefaultAllocator).
	Allocator memory.Allocator
}

// DefaultConfig returns the pipeline defaults, mp 1, one epoch, the embedded
// server with in-process connections only, a 1 GiB file stream, 1024 chunks of
// prefetch, a 5-minute ack wait, recalibration at epoch boundaries, no HTTP.
func DefaultConfig() Config {
	pub := proto.DefaultPublisherConfig()
	pub.AckTimeout = 5 * time.Second
	return Config{
		Pipeline: pipeline.DefaultConfig(), MP: 1, Epochs: 1,
		NATS: natsenv.Config{DataDir: "mmfeed-data", MaxPayload: 8 << 20, ReconnectWait: 250 * time.Millisecond},
		Role: RoleAll, WorkAckWait: 2 * time.Second, WorkAhead: 4,
		DataPlane: proto.DataPlaneCore, LeaseTTL: 5 * time.Second, StreamMaxBytes: 1 << 30, Replicas: 1, Duplicates: 2 * time.Minute,
		MaxAckPending: 1024, AckWait: 5 * time.Minute, Publisher: pub,
		MinObservations: 16, WaitForTrainers: true, RegisterWait: 20 * time.Second,
		ProgressEvery: 10 * time.Second, AssetCheck: 2 * time.Second, StuckAfter: 30 * time.Second, GiveUpAfter: 10 * time.Minute,
	}
}

// Validate checks every field.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("serve: "+format+": %w", append(a, ErrInvalidConfig)...)
	}
	if err := proto.ValidateJob(c.Job); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if c.LeaseTTL < 400*time.Millisecond {
		return bad("lease TTL %v: want at least 400ms", c.LeaseTTL)
	}
	switch {
	case c.Role == RoleWorker:
		return bad("role worker runs RunWorker, not a Service")
	case c.Role != RoleAll && c.Role != RolePlanner:
		return bad("role %q: want %s, %s or %s", c.Role, RoleAll, RolePlanner, RoleWorker)
	case c.LocalWorkers < 0 || (c.LocalWorkers > 0 && c.Role != RolePlanner):
		return bad("local workers %d: want 0, or > 0 with role planner", c.LocalWorkers)
	case c.Role == RolePlanner && !c.NATS.External() && c.NATS.Listen == "" && c.LocalWorkers == 0:
		return bad("a planner on an in-process-only embedded server without local workers: no worker can reach it (set a listen address, --nats URL or local workers)")
	case c.Role == RolePlanner && (c.WorkAckWait < 100*time.Millisecond || c.WorkAhead < 1):
		return bad("work ack wait %v (want ≥ 100ms), work ahead %d (want ≥ 1)", c.WorkAckWait, c.WorkAhead)
	}
	if c.DataPlane != proto.DataPlaneCore && c.DataPlane != proto.DataPlaneJetStream {
		return bad("data plane %q: want %s or %s", c.DataPlane, proto.DataPlaneCore, proto.DataPlaneJetStream)
	}
	if err := c.Pipeline.Validate(); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if err := c.layout().Validate(); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	switch {
	case c.Epochs < 1:
		return bad("epochs %d < 1", c.Epochs)
	case c.StreamMaxBytes <= 0 || c.Replicas < 1 || c.Replicas > 5 || c.Duplicates <= 0:
		return bad("stream max bytes %d, replicas %d, duplicates %v", c.StreamMaxBytes, c.Replicas, c.Duplicates)
	case c.MaxAckPending < 1 || c.AckWait <= 0:
		return bad("max ack pending %d, ack wait %v", c.MaxAckPending, c.AckWait)
	case c.Recalibrate < -1:
		return bad("recalibrate %d (want -1, 0 or K > 0)", c.Recalibrate)
	case c.MinObservations < 8:
		return bad("min observations %d < 8 (the cost model has 7 features)", c.MinObservations)
	case c.RegisterWait < 0:
		return bad("register wait %v", c.RegisterWait)
	case c.ProgressEvery < 0:
		return bad("progress interval %v", c.ProgressEvery)
	case c.AssetCheck < 0 || c.StuckAfter <= 0 || c.GiveUpAfter < 0:
		return bad("asset check %v, stuck after %v, give up after %v", c.AssetCheck, c.StuckAfter, c.GiveUpAfter)
	case c.HTTPToken != "" && c.HTTP == "":
		return bad("an HTTP token without an HTTP address")
	case (c.HTTPTLSCert == "") != (c.HTTPTLSKey == "") || c.HTTPTLSCert != "" && c.HTTP == "":
		return bad("HTTP TLS needs a certificate, its key and an HTTP address")
	}
	if err := c.Publisher.Validate(); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if c.HTTP != "" {
		host, _, err := net.SplitHostPort(c.HTTP)
		if err != nil {
			return bad("http address %q: %v", c.HTTP, err)
		}
		if !natsenv.Loopback(host) && c.HTTPToken == "" && !c.Insecure { // "" listens on every address
			return fmt.Errorf("serve: http listens on %s without a token (--http-token, or --insecure): %w", c.HTTP, ErrInsecure)
		}
	}
	return c.NATS.Validate()
}

func (c Config) layout() proto.Layout {
	return proto.Layout{DP: c.Pipeline.Plan.DP, MP: c.MP, Placement: c.Pipeline.Plan.Placement.String(), PP: c.Pipeline.Plan.PP}
}

// ranks is dp × mp.
func (c Config) ranks() int { return c.Pipeline.Plan.DP * c.MP }

func (c Config) lastEpoch() int { return c.Pipeline.Plan.Epoch + c.Epochs - 1 }

// core reports whether payloads travel on the core data plane. Only
// newDataPlane asks (internal/arch): the rest of serve asks the
// deliver.DataPlane.
func (c Config) core() bool { return c.DataPlane == proto.DataPlaneCore }
