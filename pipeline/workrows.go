package pipeline

import (
	"context"

	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/proto"
)

// Row preprocesses one planned sample: ent is its index entry, planned its
// row as the plan has it (id, token counts, cost, weight). It returns the row
// with token ids and the image tensor; a sample that fails here is
// quarantined (when its weight is positive) and kept with weight 0 and zero
// pixels, exactly as Run does, so a row built by Row is identical to the
// one Run builds for the same entry. The row carries the entry's kept
// values (Config.Loader.Keep), also when it fails. Safe for concurrent use.
func (pp *Preprocessor) Row(ctx context.Context, ent loader.Entry, planned proto.Row) proto.Row {
	return pp.EpochRow(ctx, pp.prep.Config.Plan.Epoch, ent, planned)
}

// EpochRow is Row for a sample of epoch, which selects its augmentation
// (Config.Image.Augment): a worker's batch item names its epoch, a
// Preprocessor of Dataset.Preprocessor has none of its own.
func (pp *Preprocessor) EpochRow(ctx context.Context, epoch int, ent loader.Entry, planned proto.Row) proto.Row {
	row := planned
	row.Keep = keepValues(pp.prep.Index, ent)
	ids, img, err := pp.process(ctx, epoch, ent)
	if err != nil {
		if planned.Weight > 0 && ctx.Err() == nil {
			pp.prep.Quarantine.Write(loader.Reject{ID: ent.ID, Location: ent.Location, Reason: reasonOf(err), Detail: err.Error()})
		}
		return pp.zeroRow(row, ids)
	}
	pp.countJPEGSource(img)
	row.InputIDs = ids
	row.Pixels = img.Data
	row.PixelShape = [3]int32{int32(img.Shape[0]), int32(img.Shape[1]), int32(img.Shape[2])}
	row.ImageTokens = int32(img.Grid[0] * img.Grid[1])
	return row
}
