package loader

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
)

// Reject reasons: short, stable codes written to quarantine.jsonl. Later
// stages (decoding) add their own codes through the same QuarantineWriter.
const (
	ReasonBadManifestLine = "bad_manifest_line" // not a JSON object, or image/text of the wrong type
	ReasonMissingImage    = "missing_image"     // no image field, file absent, or no image in a tar group
	ReasonUnreadableImage = "unreadable_image"  // the image exists but cannot be read (permissions, not a file, I/O)
	ReasonEmptyImage      = "empty_image"       // zero-byte image
	ReasonMissingCaption  = "missing_caption"   // no caption (tar group, sidecar, null text)
	ReasonEmptyCaption    = "empty_caption"     // caption empty after trimming white space
	ReasonBinaryCaption   = "binary_caption"    // caption is binary, see CheckCaption
	ReasonBadCaption      = "bad_caption"       // a WebDataset .json caption member is not valid JSON
	ReasonBrokenTar       = "broken_tar"        // a tar header or member could not be read; rest of the shard skipped
	ReasonTooLarge        = "too_large"         // image over Options.MaxImageBytes or caption over MaxCaptionBytes
	ReasonEscapesRoot     = "escapes_root"      // a path leaves the dataset folder (.., a symbolic link, a tar member name), or absolute and not allowed
	ReasonNotRegular      = "not_regular_file"  // an image or caption is a named pipe, device, socket or directory
	ReasonBadParquetFile  = "bad_parquet_file"  // a Parquet file lacks the columns or has the wrong types; the whole file is skipped
	ReasonDuplicateID     = "duplicate_id"      // Scan saw the id before; the later copy is rejected
	ReasonBadParquetRow   = "bad_parquet_row"   // a Parquet row group could not be read (or is over MaxRowGroupBytes); one reject per row group
)

// Reject is one quarantined sample. It is also the JSON shape of a
// quarantine.jsonl line.
type Reject struct {
	ID       string `json:"id"`       // sample id when known, else ""
	Location string `json:"location"` // where the sample lives, e.g. "data/manifest.jsonl:17"
	Reason   string `json:"reason"`   // one of the Reason* codes (or a later stage's code)
	Detail   string `json:"detail"`   // human-readable detail, e.g. the OS error
}

// Stats counts what a source (or index) saw. Invariant, after the source
// returned io.EOF: Seen == Emitted + Quarantined, and Quarantined is the sum of
// ByReason.
type Stats struct {
	Seen        int64            `json:"seen"`
	Emitted     int64            `json:"emitted"`
	Quarantined int64            `json:"quarantined"`
	ByReason    map[string]int64 `json:"by_reason"`
}

// Tally is a thread-safe Stats accumulator. The zero value is ready to use.
type Tally struct {
	mu sync.Mutex
	s  Stats
}

// Emit counts one sample seen and emitted.
func (t *Tally) Emit() {
	t.mu.Lock()
	t.s.Seen++
	t.s.Emitted++
	t.mu.Unlock()
}

// Quarantine counts one sample seen and quarantined for reason.
func (t *Tally) Quarantine(reason string) {
	t.mu.Lock()
	t.s.Seen++
	t.s.Quarantined++
	if t.s.ByReason == nil {
		t.s.ByReason = make(map[string]int64)
	}
	t.s.ByReason[reason]++
	t.mu.Unlock()
}

// Stats returns a copy of the counters.
func (t *Tally) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.s
	s.ByReason = maps.Clone(t.s.ByReason)
	if s.ByReason == nil {
		s.ByReason = map[string]int64{}
	}
	return s
}

// QuarantineWriter writes Rejects as JSON lines ({"id","location","reason",
// "detail"}) and counts them by reason. It is safe for concurrent use: the
// loader and later stages (decode failures) share one writer. A nil io.Writer
// only counts.
type QuarantineWriter struct {
	mu     sync.Mutex
	w      io.Writer
	counts map[string]int64
	// examples keeps the first QuarantineExamples ids (or locations) per reason.
	examples map[string][]string
	total    int64
	err      error
}

// QuarantineExamples is how many example ids per reason a QuarantineWriter keeps.
const QuarantineExamples = 3

// NewQuarantineWriter returns a writer that appends lines to w (nil: count
// only). The caller owns w and closes it after the last Write.
func NewQuarantineWriter(w io.Writer) *QuarantineWriter {
	return &QuarantineWriter{w: w, counts: make(map[string]int64)}
}

// Write records r. It returns the first write error seen (later calls keep
// counting and return the same error).
func (q *QuarantineWriter) Write(r Reject) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.counts[r.Reason]++
	q.total++
	if ex := q.examples[r.Reason]; len(ex) < QuarantineExamples {
		if q.examples == nil {
			q.examples = make(map[string][]string)
		}
		id := r.ID
		if id == "" {
			id = r.Location
		}
		q.examples[r.Reason] = append(ex, id)
	}
	if q.w == nil || q.err != nil {
		return q.err
	}
	line, err := json.Marshal(r)
	if err != nil {
		q.err = fmt.Errorf("loader: quarantine encode: %w", err)
		return q.err
	}
	line = append(line, '\n')
	if _, err := q.w.Write(line); err != nil {
		q.err = fmt.Errorf("loader: quarantine write: %w", err)
	}
	return q.err
}

// Func adapts the writer to Options.OnReject (write errors are kept and
// reported by Err).
func (q *QuarantineWriter) Func() func(Reject) {
	return func(r Reject) { _ = q.Write(r) }
}

// Counts returns a copy of the per-reason counts.
func (q *QuarantineWriter) Counts() map[string]int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return maps.Clone(q.counts)
}

// Examples returns a copy of the first few ids (the location when a sample
// had no id) written per reason, in write order.
func (q *QuarantineWriter) Examples() map[string][]string {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make(map[string][]string, len(q.examples))
	for r, ex := range q.examples {
		out[r] = slices.Clone(ex)
	}
	return out
}

// Total returns the number of rejects written.
func (q *QuarantineWriter) Total() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.total
}

// Err returns the first write error, if any.
func (q *QuarantineWriter) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// ReadQuarantine parses quarantine.jsonl content (for tests and reports).
func ReadQuarantine(r io.Reader) ([]Reject, error) {
	dec := json.NewDecoder(r)
	var out []Reject
	for {
		var rj Reject
		err := dec.Decode(&rj)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("loader: read quarantine: %w", err)
		}
		out = append(out, rj)
	}
}
