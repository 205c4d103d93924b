package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/mmfeed/mmfeed/tokenize"
)

// maxViewBytes bounds one batch a viewer reassembles.
const maxViewBytes = 1 << 30

// ErrNotCore: no service answers viewer fetches for the job (it does not run
// on the core data plane, or is not running); ReadStreamStep may still read
// a --data-plane jetstream job.
var ErrNotCore = errors.New("pipeline: no service of the job on the core data plane")

// ReadServiceStep reads the micro-batches of (epoch, step) for dp rank dp
// from a running job on the core data plane (the default), without taking
// them: it sends viewer fetches (proto.ViewBatch), which the service answers
// from the batches it holds or by building the batch again from the plan for
// the viewer only; the rank's position, batches and acks are untouched. It
// asks micro-batches 0, 1, ... of each mp rank until the service says the
// key is outside the plan, reads mp ranks 0, 1, ... until none answers, and
// merges them by sample id like ReadStreamStep. A job with no service on the
// core data plane gives ErrNotCore; a step outside the plan, ErrNoStep.
func ReadServiceStep(ctx context.Context, nc *nats.Conn, job string, epoch, step, dp int, tk *tokenize.Tokenizer) ([]SheetSample, error) {
	var m sheetMerge
	for mp := range maxInspectMP {
		for mb := 0; ; mb++ {
			key := proto.BatchKey{Job: job, Epoch: epoch, Step: step, MicroBatch: mb, DPRank: dp, MPRank: mp}
			payload, err := proto.ViewBatch(ctx, nc, key, maxViewBytes)
			switch {
			case errors.Is(err, proto.ErrNoService) && mp == 0 && mb == 0:
				return nil, fmt.Errorf("pipeline: inspect job %q dp rank %d: %w: %w", job, dp, ErrNotCore, err)
			case errors.Is(err, proto.ErrNoService) && mb == 0:
				return m.out, nil // no more mp ranks
			case errors.Is(err, proto.ErrOutsidePlan) && mb == 0:
				return nil, fmt.Errorf("job %s epoch %d step %d dp rank %d: %w: %w", job, epoch, step, dp, ErrNoStep, err)
			case errors.Is(err, proto.ErrOutsidePlan):
			case err != nil:
				return nil, fmt.Errorf("pipeline: inspect: %w", err)
			}
			if err != nil {
				break // the step's micro-batches are all read
			}
			rows, err := decodeStreamBatch(payload, mb)
			if err != nil {
				return nil, fmt.Errorf("pipeline: inspect %v: %w", key, err)
			}
			if err := m.add(rows, tk); err != nil {
				return nil, err
			}
		}
	}
	return m.out, nil
}
