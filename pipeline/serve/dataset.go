package serve

import (
	"context"
	"fmt"

	"github.com/mmfeed/mmfeed/pipeline"
)

// jobDataset is the job's dataset (pipeline.Dataset: the index, the
// tokenizer, the features), opened once by the first epoch's preparation
// and shared by every epoch's plan and preprocessing; Run closes it after
// the epochs. Its wait is cancellable; an open that failed is tried again.
type jobDataset struct {
	sem   chan struct{} // held while opening
	ds    *pipeline.Dataset
	opens int // datasets opened (tests: one per Run)
}

func newJobDataset() *jobDataset { return &jobDataset{sem: make(chan struct{}, 1)} }

// get returns the dataset of cfg, opening it on the first call.
func (j *jobDataset) get(ctx context.Context, cfg pipeline.Config) (*pipeline.Dataset, error) {
	select {
	case j.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-j.sem }()
	if j.ds == nil {
		ds, err := pipeline.OpenDataset(ctx, cfg, nil)
		if err != nil {
			return nil, fmt.Errorf("serve: open dataset: %w", err)
		}
		j.ds, j.opens = ds, j.opens+1
	}
	return j.ds, nil
}

// close releases the dataset; nothing may use it any more.
func (j *jobDataset) close() {
	j.sem <- struct{}{}
	defer func() { <-j.sem }()
	if j.ds != nil {
		_ = j.ds.Close()
		j.ds = nil
	}
}
