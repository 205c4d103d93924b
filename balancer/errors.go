package balancer

import "errors"

// Sentinel errors. Functions wrap them with context; test with errors.Is.
var (
	// ErrInvalidConfig reports a Config, PartitionConfig, ModelShape or Budget
	// field out of range.
	ErrInvalidConfig = errors.New("invalid config")
	// ErrInvalidItem reports an item that cannot be planned (negative or absurd
	// token counts, non-finite complexity, duplicate id). Build records such
	// items in Plan.Rejected instead of failing.
	ErrInvalidItem = errors.New("invalid item")
	// ErrBudgetExceeded reports an item or a set of items that cannot be placed
	// in the configured micro-batches without exceeding the per-micro-batch
	// Budget.
	ErrBudgetExceeded = errors.New("micro-batch budget exceeded")
	// ErrTooFewItems reports a global batch with fewer items than dp ×
	// micro-batches, so some micro-batch would be empty.
	ErrTooFewItems = errors.New("too few items for dp × micro-batches")
	// ErrNoObservations reports a calibration with too few usable observations.
	ErrNoObservations = errors.New("not enough observations")
	// ErrBadFit reports a calibration whose refit is not usable: a
	// non-finite or negative coefficient, or predictions worse than the
	// rescaled prior. Callers keep their last good model.
	ErrBadFit = errors.New("calibration fit rejected")
	// ErrUnknownName reports an unknown preset, strategy, placement or tail name.
	ErrUnknownName = errors.New("unknown name")
	// ErrMalformed reports unparsable outside input (observation lines).
	ErrMalformed = errors.New("malformed input")
)
