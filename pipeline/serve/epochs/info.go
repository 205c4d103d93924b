package epochs

import (
	"fmt"

	"github.com/mmfeed/mmfeed/balancer"
)

// Segment records the cost model the steps from FromStep on were planned with.
type Segment struct {
	FromStep int                `json:"from_step"`
	Model    balancer.CostModel `json:"model"`
	Fit      *balancer.Fit      `json:"fit,omitempty"`
}

// Info is what a register reply needs of an epoch, and how to replan it
// after a restart (KV epoch.<e>).
type Info struct {
	Epoch        int    `json:"epoch"`
	Steps        int    `json:"steps"`
	MicroBatches int    `json:"micro_batches"`
	PlanHash     string `json:"plan_hash"`
	// VocabSize is the tokenizer's vocabulary size (0: unknown), told to
	// trainers in the register reply.
	VocabSize int `json:"vocab_size,omitempty"`
	// Segments lists the models in use, the first from step 0 (the base plan).
	Segments []Segment `json:"segments"`
	// DP is the dp the base plan was built for (0 in records older than
	// elastic resume: the job's dp).
	DP int `json:"dp,omitempty"`
	// Resize, when set, re-planned the epoch's rest for another dp (resize.go).
	Resize *ResizeSegment `json:"resize,omitempty"`
}

// ResizeSegment records that an epoch's steps from FromStep on were planned
// for DP ranks (the steps before it for Info.DP).
type ResizeSegment struct {
	FromStep int `json:"from_step"`
	DP       int `json:"dp"`
	// Segments is how many of Info.Segments were recorded before the
	// resize (they replay before it, the others after it).
	Segments int `json:"segments"`
}

// Validate checks an Info read back from the KV bucket.
func (e Info) Validate() error {
	if e.Steps < 0 || e.MicroBatches < 1 || len(e.Segments) == 0 || e.Segments[0].FromStep != 0 {
		return fmt.Errorf("serve: epoch info %d: steps %d, micro-batches %d, %d segments: %w", e.Epoch, e.Steps, e.MicroBatches, len(e.Segments), ErrState)
	}
	if r := e.Resize; r != nil && (r.DP < 1 || r.FromStep < 0 || r.FromStep > e.Steps || r.Segments < 1 || r.Segments > len(e.Segments)) {
		return fmt.Errorf("serve: epoch info %d: resize to dp %d from step %d after %d segments: %w", e.Epoch, r.DP, r.FromStep, r.Segments, ErrState)
	}
	for i, s := range e.Segments {
		if err := s.Model.Validate(); err != nil {
			return fmt.Errorf("serve: epoch info %d segment %d: %v: %w", e.Epoch, i, err, ErrState)
		}
		if i > 0 && (s.FromStep <= e.Segments[i-1].FromStep || s.FromStep > e.Steps) {
			return fmt.Errorf("serve: epoch info %d segment %d from step %d: %w", e.Epoch, i, s.FromStep, ErrState)
		}
	}
	return nil
}
