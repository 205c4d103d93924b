package pipeline

import (
	"context"
	"fmt"
	"io"

	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/mmfeed/mmfeed/tokenize"
)

// OpenDataset indexes cfg.Input and opens the tokenizer, without the feature
// pass: what a preprocessing worker needs to turn planned samples into rows
// (Preprocessor.Row). Rejects of the index scan go to quarantine. The caller
// closes the result; its Features are empty.
func OpenDataset(ctx context.Context, cfg Config, quarantine io.Writer) (*Prepared, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	q := loader.NewQuarantineWriter(quarantine)
	opts := cfg.Loader
	opts.OnReject = q.Func()
	ix, err := loader.BuildIndex(ctx, cfg.Input, opts)
	if err != nil {
		return nil, fmt.Errorf("pipeline: index %s: %w", cfg.Input, err)
	}
	tk, err := tokenize.Open(cfg.Tokenizer)
	if err != nil {
		ix.Close()
		return nil, err
	}
	return &Prepared{Config: cfg, Index: ix, Quarantine: q, Tokenizer: tk}, nil
}

// Row preprocesses one planned sample: ent is its index entry, planned its
// row as the plan has it (id, token counts, cost, weight). It returns the row
// with token ids and the image tensor; a sample that fails here is
// quarantined (when its weight is positive) and kept with weight 0 and zero
// pixels, exactly as Run does, so a row built by Row is identical to the
// one Run builds for the same entry. Safe for concurrent use.
func (pp *Preprocessor) Row(ctx context.Context, ent loader.Entry, planned proto.Row) proto.Row {
	row := planned
	ids, img, err := pp.process(ctx, ent)
	if err != nil {
		if planned.Weight > 0 && ctx.Err() == nil {
			pp.prep.Quarantine.Write(loader.Reject{ID: ent.ID, Location: ent.Location, Reason: reasonOf(err), Detail: err.Error()})
		}
		return pp.zeroRow(row, ids)
	}
	row.InputIDs = ids
	row.Pixels = img.Data
	row.PixelShape = [3]int32{int32(img.Shape[0]), int32(img.Shape[1]), int32(img.Shape[2])}
	row.ImageTokens = int32(img.Grid[0] * img.Grid[1])
	return row
}
