package epochs

import (
	"errors"

	"github.com/mmfeed/mmfeed/pipeline/serve/work"
)

// Sentinel errors (serve.ErrNotReady and serve.ErrState are these). They are
// wrapped with context, so test with errors.Is.
var (
	// ErrNotReady: a trainer asked for an epoch the service has not planned
	// yet; it should register again.
	ErrNotReady = errors.New("epoch not planned yet")
	// ErrState: a value in the job's KV bucket is malformed (the work
	// planner's sentinel: one value for the whole service).
	ErrState = work.ErrState
)
