package proto

import "errors"

// Sentinel errors. Functions wrap them with context ("proto: ...: %w"), so
// test with errors.Is.
var (
	// ErrInvalidName: a job name, subject token or control kind breaks the
	// naming rules (see ValidateJob).
	ErrInvalidName = errors.New("invalid name")
	// ErrInvalidMeta: a BatchMeta field is out of range or inconsistent.
	ErrInvalidMeta = errors.New("invalid batch meta")
	// ErrInvalidRow: a Row does not match its BatchMeta (pixel bytes vs
	// shape and dtype, shape vs fixed shape, negative counts).
	ErrInvalidRow = errors.New("invalid row")
	// ErrSchema: a record or IPC payload does not follow the mmfeed schema.
	ErrSchema = errors.New("schema mismatch")
	// ErrTooLarge: a payload, chunk or record exceeds a configured limit.
	ErrTooLarge = errors.New("too large")
	// ErrHeader: a chunk message has a missing or malformed mmfeed header.
	ErrHeader = errors.New("bad chunk header")
	// ErrChunkMissing: a batch ended (or was forced out) before all of its
	// chunks arrived.
	ErrChunkMissing = errors.New("chunk missing")
	// ErrChunkDuplicate: the same chunk index arrived twice with different
	// contents, or twice where duplicates are not allowed.
	ErrChunkDuplicate = errors.New("duplicate chunk")
	// ErrChunkMismatch: chunks of one batch disagree on count, size or
	// checksum, or the reassembled size differs from the announced size.
	ErrChunkMismatch = errors.New("inconsistent chunks")
	// ErrChecksum: the reassembled payload's CRC-32C differs from the
	// Mmfeed-Checksum header.
	ErrChecksum = errors.New("checksum mismatch")
	// ErrControl: a control message is malformed or does not match the job.
	ErrControl = errors.New("invalid control message")
	// ErrLayout: a trainer's layout (dp, mp, ranks, placement) does not
	// match the job's layout.
	ErrLayout = errors.New("layout mismatch")
	// ErrInvalidConfig: a Config field is out of range.
	ErrInvalidConfig = errors.New("invalid config")
	// ErrPrefetchTooSmall: a Consumer holds MaxAckPending chunks and still
	// has no complete batch, so the server will deliver nothing more.
	ErrPrefetchTooSmall = errors.New("max ack pending too small for batch")
	// ErrClosed: the Publisher or Consumer was closed.
	ErrClosed = errors.New("closed")
)
