package serve

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/proto"
)

// buildView preprocesses and encodes one batch of rank from the epoch's plan
// held in memory (the epoch being published or the one before). Samples that
// fail to decode are not quarantined again (the publisher did that).
func (s *Service) buildView(ctx context.Context, rank int, key proto.BatchKey) ([]byte, bool, error) {
	ep := s.epochs.Plan(key.Epoch)
	if ep == nil {
		return nil, false, fmt.Errorf("epoch %d is not planned in the service's memory now (only the epoch being served and the one before are)", key.Epoch)
	}
	plan, n, ok := s.epochs.PlanFrom(ep, key.Step)
	if !ok {
		return nil, true, fmt.Errorf("step %d outside epoch %d's %d steps", key.Step, key.Epoch, n)
	}
	dp := rank / s.cfg.MP
	one := balancer.Step{Index: key.Step, Ranks: make([][]balancer.MicroBatch, len(plan.Steps[0].Ranks))}
	one.Ranks[dp] = plan.Steps[0].Ranks[dp]
	plan.Steps = []balancer.Step{one}
	prep := *ep.Prepared()
	prep.Quarantine = loader.NewQuarantineWriter(io.Discard)
	pp, err := pipeline.NewPreprocessor(&prep)
	if err != nil {
		return nil, false, err
	}
	var rows []proto.Row
	err = pp.Run(ctx, plan, func(sb pipeline.StepBatch) error {
		if key.MicroBatch >= len(sb.Rows[dp]) {
			return fmt.Errorf("micro-batch %d outside the step's %d: %w", key.MicroBatch, len(sb.Rows[dp]), proto.ErrOutsidePlan)
		}
		rows = sb.Rows[dp][key.MicroBatch]
		return nil
	})
	if err != nil {
		return nil, errors.Is(err, proto.ErrOutsidePlan), err
	}
	if s.epochs.Plan(key.Epoch) != ep { // closed while it was read: the rows may be wrong
		return nil, false, fmt.Errorf("epoch %d was released while the batch was built", key.Epoch)
	}
	meta, err := s.batchMeta(ep, key.Step, rank)
	if err != nil {
		return nil, false, err
	}
	meta.MicroBatch = key.MicroBatch
	payload, err := s.encodeBatch(s.mem, meta, rows)
	return payload, false, err
}
