package produce

import (
	"context"
	"log/slog"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
)

// Config is what the publish loop needs of the job's configuration.
type Config struct {
	Job             string
	MP              int            // mp ranks per dp rank
	LastEpoch       int            // the job's last epoch
	Epochs          int            // the job's epoch count (logged)
	MicroBatches    int            // micro-batches per step and rank
	Placement       string         // proto.Layout's placement (proto.ModalityFor)
	Image           imgproc.Config // the image policy (the planner's items)
	StreamMaxBytes  int64          // the outbox's or the stream's bound (checkStreamRoom)
	WaitForTrainers bool           // after the last epoch, wait for every rank to complete it
}

// Parts are the parts the publish loop acts through.
type Parts struct {
	Log       *slog.Logger
	Mem       memory.Allocator // the Arrow records'
	Epochs    Epochs
	Ranks     *deliver.Ranks
	Publisher *deliver.Publisher
	Rewind    deliver.RewindParts // given to Publisher.Drain and Apply
	Rank      deliver.RankParts   // given to deliver.PublishRank
	Work      *work.Planner       // the planner role's work queue; nil with role all
	Report    Report
	Metrics   Metrics
	Service   Service
}

// Epochs is the epoch book as the publish loop uses it.
type Epochs interface {
	// Epoch returns the plan of epoch e and makes it the one being
	// published.
	Epoch(ctx context.Context, e int) (*epochs.Plan, error)
	// Plan returns the plan of epoch e held in memory, nil when none is.
	Plan(e int) *epochs.Plan
	// PlanFrom returns ep's planned steps from start, its step count and
	// whether start is one of its steps.
	PlanFrom(ep *epochs.Plan, start int) (plan *balancer.Plan, n int, ok bool)
	// Norm moves a position at an epoch's end to the next epoch's start.
	Norm(p proto.Pos) proto.Pos
	// PlanAheadDue reports whether the next epoch should be planned now;
	// PlanAhead plans it in the background, WaitBackground waits for that.
	PlanAheadDue(ep *epochs.Plan, last, step, stepsDone int, elapsed time.Duration) bool
	PlanAhead(ctx context.Context, e int, log *slog.Logger)
	WaitBackground()
}

// Report is the live report as the publish loop feeds it.
type Report interface {
	// Published records a step about to be handed to the ranks.
	Published(ep *epochs.Plan, sb pipeline.StepBatch)
}

// Metrics counts the publish loop's stages and steps.
type Metrics interface {
	// Preprocessed adds the wait for the preprocessing (or the workers).
	Preprocessed(d time.Duration)
	// Built and Encoded add the time one micro-batch's record took to
	// build and to encode.
	Built(d time.Duration)
	Encoded(d time.Duration)
	// Imbalance observes a published step's imbalance from the ranks'
	// predicted costs.
	Imbalance(costs []float64)
}

// Service is what the publish loop asks of the rest of the
// service.
type Service interface {
	// AwaitResize waits until a pending resize is decided.
	AwaitResize(ctx context.Context) error
	// RecalibrateDue refits and replans the unpublished rest of ep when due;
	// it reports whether the run must restart on the new steps.
	RecalibrateDue(ctx context.Context, ep *epochs.Plan, step int, queued []proto.Pos) bool
	// RecordFinished records that every batch up to lastEpoch is published.
	RecordFinished(ctx context.Context, lastEpoch int) error
}

// Producer turns the epochs' plans into each rank's encoded micro-batches
// and queues them to the rank publishers.
type Producer struct {
	cfg       Config
	log       *slog.Logger
	mem       memory.Allocator
	epochs    Epochs
	ranks     *deliver.Ranks
	publisher *deliver.Publisher
	rewind    deliver.RewindParts
	rank      deliver.RankParts
	work      *work.Planner
	live      Report
	met       Metrics
	svc       Service
}

// New returns the publish loop of cfg over parts.
func New(cfg Config, parts Parts) *Producer {
	return &Producer{cfg: cfg, log: parts.Log, mem: parts.Mem, epochs: parts.Epochs, ranks: parts.Ranks,
		publisher: parts.Publisher, rewind: parts.Rewind, rank: parts.Rank, work: parts.Work, live: parts.Report,
		met: parts.Metrics, svc: parts.Service}
}
