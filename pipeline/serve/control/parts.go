package control

import (
	"context"
	"log/slog"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/proto"
)

// Config is what control needs of the job's configuration.
type Config struct {
	Job          string
	Layout       proto.Layout  // dp, mp, pp and placement a register must match
	FirstEpoch   int           // the job's first epoch
	LastEpoch    int           // the job's last epoch
	Pack         bool          // the plan is for packed micro-batches
	RegisterWait time.Duration // how long a register waits for its epoch's plan
}

// Parts are the collaborators control acts through; each owns its state.
type Parts struct {
	Log        *slog.Logger
	RateLog    *RateLog // the refusals' log, shared with Replies
	Metrics    Metrics
	Replies    *Guard
	Ranks      Ranks
	Epochs     Epochs
	Calibrator Calibrator
	Report     Report
	Tasks      Tasks
	Plane      Plane
	Delivery   Delivery
}

// Ranks is the ranks' positions (the rank table, which owns them and their
// KV records): control reads and moves a rank only through these verbs.
type Ranks interface {
	// Cursor is the next step published to rank r.
	Cursor(r int) proto.Pos
	// Next is the first step rank r's trainer still needs.
	Next(r int) proto.Pos
	// Gen is the replay generation of rank r's publishes.
	Gen(r int) int
	// SwapConn records the connection of rank r's register and reports
	// whether it is the one of its previous register.
	SwapConn(r int, conn string) (same bool)
	// SetNext records the first step rank r's trainer still needs; with
	// force it may move backwards (a register). It reports whether it set
	// the position.
	SetNext(r int, next proto.Pos, force bool) bool
}

// Epochs is what control asks of the epoch book (*epochs.Book).
type Epochs interface {
	// Norm moves a position at the end of an epoch to the next epoch's start.
	Norm(p proto.Pos) proto.Pos
	// WaitInfo returns epoch e's info, waiting up to wait for its plan.
	WaitInfo(ctx context.Context, e int, wait time.Duration) (epochs.Info, error)
	// Features returns the planned features of a step's dp rank.
	Features(e, step, dp int) (balancer.Features, bool)
}

// Calibrator takes a measured step with its planned features (the cost
// models' observations).
type Calibrator interface {
	Add(fb proto.Feedback, f balancer.Features)
}

// Report is the live report: it takes every measured step.
type Report interface {
	Measured(fb proto.Feedback)
}

// Metrics counts what control and the reply guard decide.
type Metrics interface {
	// Control counts one control message of kind with its result ("ok",
	// "refused", "busy", "merged", "unacknowledged").
	Control(kind, result string)
	// ReplyRefused counts a request whose reply subject was refused.
	ReplyRefused(kind, reason string)
	// Feedback records a rank's measured step (its timings).
	Feedback(fb proto.Feedback)
}

// Tasks runs the goroutines control starts for a message.
type Tasks interface {
	// Start runs f on its own goroutine with the tasks' context and reports
	// whether it did (false once the service stops).
	Start(f func(ctx context.Context)) bool
	// Context ends when the service stops.
	Context() context.Context
}

// Plane is what control asks of the data plane (the core outbox or the
// JetStream stream).
type Plane interface {
	// FirstHeld is the first chunk the data plane still holds for rank.
	FirstHeld(ctx context.Context, rank int) (proto.ChunkHeader, bool, error)
	// FillRegisterReply fills the data plane's part of a register reply.
	FillRegisterReply(rep *proto.RegisterReply, dp, mp int)
	// TrainerReplaced tells the plane that a new incarnation of rank's
	// trainer registered: what the old one was delivered and did not
	// acknowledge must come to the new one at once.
	TrainerReplaced(ctx context.Context, rank int) error
}

// Delivery is what control asks of the publish loop (rewinds, wake-ups) and
// of the resize decision.
type Delivery interface {
	// Rewind republishes rank from to with the next generation; done, when
	// not nil, gets the rewind's outcome.
	Rewind(ctx context.Context, rank int, to proto.Pos, reason string, done chan error) error
	// DecideResize accepts or refuses a dp change when a rank registers.
	DecideResize(ctx context.Context, epoch, step int) error
	// Poke wakes the publish loop: a rank's next needed step moved.
	Poke()
}
