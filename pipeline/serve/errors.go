package serve

import (
	"github.com/mmfeed/mmfeed/pipeline/serve/control"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
)

// Sentinel errors. The service wraps them with context ("serve: ...: %w"), so
// test with errors.Is.
var (
	// ErrInvalidConfig: a Config field is out of range or inconsistent.
	ErrInvalidConfig = natsenv.ErrInvalidConfig
	// ErrJobMismatch: the job's state in the KV bucket was written by a service
	// with another configuration (dataset, layout, batch shape, seed, ...);
	// resuming it would change the plan under the trainers; or a worker's
	// index of the job's input is not the planner's (work.ErrJobMismatch).
	ErrJobMismatch = work.ErrJobMismatch
	// ErrNotReady: a trainer asked for an epoch the service has not planned
	// yet; it should register again (epochs.ErrNotReady).
	ErrNotReady = epochs.ErrNotReady
	// ErrEpochRange: a trainer asked for an epoch outside the job's epochs.
	ErrEpochRange = control.ErrEpochRange
	// ErrInsecure: NATS or HTTP would listen on a non-loopback address
	// without authentication, and Config.Insecure is not set.
	ErrInsecure = natsenv.ErrInsecure
	// ErrState: a value in the job's KV bucket is malformed, or the work
	// planner met a state it never made (work.ErrState, epochs.ErrState).
	ErrState = work.ErrState
)

// ErrWorkFailed: the workers failed one item work.ItemMaxFailures times;
// the error carries their last reason (work.ErrWorkFailed).
var ErrWorkFailed = work.ErrWorkFailed

// ErrLeaseLost: the service could not renew its leadership of the job in
// time, or another service holds it now; it stops so that only one serves.
var ErrLeaseLost = natsenv.ErrLeaseLost

// ErrLeaseFenced: a write to the job's state was refused because the
// service has not renewed its lease for 3/4 of the TTL (a NATS outage);
// writes resume once it holds the lease again.
var ErrLeaseFenced = natsenv.ErrLeaseFenced

// ErrStorageFull: a write of the job's state failed because the embedded
// server's data directory is full (ENOSPC), or its JetStream turned itself
// off after such a failure.
var ErrStorageFull = natsenv.ErrStorageFull
