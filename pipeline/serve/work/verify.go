package work

import (
	"fmt"
	"slices"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/proto"
)

// Reasons a worker's batch result is rejected: the reason label of
// mmfeed_serve_work_results_rejected_total.
const (
	RejectDecode = "decode" // not an mmfeed Arrow IPC record
	RejectConfig = "config" // built with another preprocessing config than the item names
	RejectSchema = "schema" // another job, epoch, step, rank, modality, normalization, vocabulary or packing
	RejectDType  = "dtype"  // another pixel dtype
	RejectShape  = "shape"  // another fixed image shape, or a row's tensor shape differs from the plan
	RejectRows   = "rows"   // more or fewer rows than planned
	RejectIDs    = "ids"    // an id the plan does not have there
	RejectOrder  = "order"  // the planned ids, in another order
	RejectTokens = "tokens" // text_tokens, an input_ids length or image_tokens differ from the plan
	RejectValues = "values" // a cost or weight differs from the plan
)

// RejectReasons are every reason, in the order /metrics lists them.
var RejectReasons = []string{RejectDecode, RejectConfig, RejectSchema, RejectDType, RejectShape, RejectRows,
	RejectIDs, RejectOrder, RejectTokens, RejectValues}

// ResultError is a rejected result: its reason (a reject* constant) and
// what differed.
type ResultError struct{ reason, detail string }

func (e *ResultError) Error() string { return e.reason + ": " + e.detail }

// Reason is the rejection's reason, a reject* constant.
func (e *ResultError) Reason() string { return e.reason }

func rejected(reason, format string, a ...any) error {
	return &ResultError{reason: reason, detail: fmt.Sprintf(format, a...)}
}

// VerifyResult checks one mp rank's payload of a batch item against the
// item the planner issued: the config hash the worker names, the schema
// metadata (job, epoch, ranks, modality, dtype, fixed shape,
// normalization, vocabulary, packing), the step and micro-batch, the row
// count, each row's id in order, cost, weight, text_tokens, input_ids
// length, image_tokens and pixel_shape (shapes, when not nil: the planned
// C,H,W of each row). A row whose planned weight is positive may come back
// with weight 0 (its sample failed on the worker and was quarantined
// there): then it may have no token ids, any valid tensor shape (a zero
// tensor) and, with dynamic resolution, one image token. Nothing is decoded
// beyond the record's own columns (no pixels are recomputed): the pixel
// values themselves are the worker's. It returns nil or a *ResultError.
func VerifyResult(it *BatchItem, shapes [][3]int32, mp int, config string, payload []byte) error {
	if config != it.Config {
		return rejected(RejectConfig, "built with config %q, the item names %q", config, it.Config)
	}
	if mp < 0 || mp >= len(it.Metas) {
		return rejected(RejectSchema, "mp rank %d of %d", mp, len(it.Metas))
	}
	rec, err := proto.DecodeIPC(memory.DefaultAllocator, payload)
	if err != nil {
		return rejected(RejectDecode, "%v", err)
	}
	defer rec.Release()
	want := it.Metas[mp]
	if err := verifyMeta(rec, want); err != nil {
		return err
	}
	if n := int(rec.NumRows()); n != len(it.Samples) {
		return rejected(RejectRows, "%d rows, planned %d", n, len(it.Samples))
	}
	cols := map[string]arrow.Array{}
	for i, c := range rec.Columns() {
		cols[rec.ColumnName(i)] = c
	}
	if s, mb := cols[proto.ColStep].(*array.Int32).Value(0), cols[proto.ColMicroBatch].(*array.Int32).Value(0); int(s) != it.Step || int(mb) != it.MicroBatch {
		return rejected(RejectSchema, "step %d micro-batch %d, planned %d, %d", s, mb, it.Step, it.MicroBatch)
	}
	if err := verifyIDs(cols[proto.ColID].(*array.String), it.Samples); err != nil {
		return err
	}
	return verifyRows(cols, want.Modality, it.Samples, shapes)
}

// verifyMeta compares the record's schema metadata with the planned meta.
func verifyMeta(rec arrow.RecordBatch, want proto.BatchMeta) error {
	got, err := proto.MetaFromSchema(rec.Schema())
	if err != nil {
		return rejected(RejectDecode, "%v", err)
	}
	if got.Modality == want.Modality && want.Modality != proto.ModalityText {
		if got.DType != want.DType {
			return rejected(RejectDType, "pixel dtype %q, planned %q", got.DType, want.DType)
		}
		if !slices.Equal(got.Shape, want.Shape) {
			return rejected(RejectShape, "fixed image shape %v, planned %v", got.Shape, want.Shape)
		}
	}
	ws, err := proto.Schema(want)
	if err != nil {
		return rejected(RejectSchema, "planned meta: %v", err)
	}
	if !rec.Schema().Metadata().Equal(ws.Metadata()) || !pixelMetaEqual(rec.Schema(), ws) {
		return rejected(RejectSchema, "schema metadata %v, planned %v", rec.Schema().Metadata(), ws.Metadata())
	}
	if !slices.Equal(got.Keep, want.Keep) {
		return rejected(RejectSchema, "kept columns %v, planned %v", got.Keep, want.Keep)
	}
	return nil
}

// pixelMetaEqual compares the pixel_values field metadata (dtype, layout,
// shape, mean, std) of two schemas.
func pixelMetaEqual(a, b *arrow.Schema) bool {
	fa, fb := a.FieldIndices(proto.ColPixelValues), b.FieldIndices(proto.ColPixelValues)
	if len(fa) != len(fb) {
		return false
	}
	for i := range fa {
		if !a.Field(fa[i]).Metadata.Equal(b.Field(fb[i]).Metadata) {
			return false
		}
	}
	return true
}

// verifyIDs checks the id column is the planned ids in plan order; the
// planned ids in another order are told apart from invented ones.
func verifyIDs(ids *array.String, planned []Sample) error {
	for i, s := range planned {
		if ids.Value(i) == s.ID {
			continue
		}
		count := make(map[string]int, len(planned))
		for _, p := range planned {
			count[p.ID]++
		}
		for j := range ids.Len() {
			if count[ids.Value(j)]--; count[ids.Value(j)] < 0 {
				return rejected(RejectIDs, "row %d is %q, not a planned id of the micro-batch", j, ids.Value(j))
			}
		}
		return rejected(RejectOrder, "row %d is %q, planned %q", i, ids.Value(i), s.ID)
	}
	return nil
}

// verifyRows checks each row's cost, weight and token counts against the
// plan (VerifyResult).
func verifyRows(cols map[string]arrow.Array, m proto.Modality, planned []Sample, shapes [][3]int32) error {
	cost, weight := cols[proto.ColCost].(*array.Float64), cols[proto.ColWeight].(*array.Float32)
	var tt, it *array.Int32
	var ii *array.List
	var ps []int32
	if m != proto.ModalityVision {
		tt, ii = cols[proto.ColTextTokens].(*array.Int32), cols[proto.ColInputIDs].(*array.List)
	}
	if m != proto.ModalityText {
		it = cols[proto.ColImageTokens].(*array.Int32)
		if len(shapes) == len(planned) {
			fsl := cols[proto.ColPixelShape].(*array.FixedSizeList)
			ps = fsl.ListValues().(*array.Int32).Int32Values()[3*fsl.Data().Offset():]
		}
	}
	for i, s := range planned {
		w := weight.Value(i)
		failed := w == 0 && s.Weight > 0
		if cost.Value(i) != s.Cost || w != s.Weight && !failed {
			return rejected(RejectValues, "row %d (%s): cost %v weight %v, planned %v, %v", i, s.ID, cost.Value(i), w, s.Cost, s.Weight)
		}
		if tt != nil {
			lo, hi := ii.ValueOffsets(i)
			if n := hi - lo; tt.Value(i) != s.TextTokens || n != int64(s.TextTokens) && !(failed && n == 0) {
				return rejected(RejectTokens, "row %d (%s): text_tokens %d, %d input ids, planned %d", i, s.ID, tt.Value(i), n, s.TextTokens)
			}
		}
		if it != nil && it.Value(i) != s.ImageTokens && !(failed && it.Value(i) == 1) {
			return rejected(RejectTokens, "row %d (%s): image_tokens %d, planned %d", i, s.ID, it.Value(i), s.ImageTokens)
		}
		if ps != nil && !failed && [3]int32(ps[3*i:3*i+3]) != shapes[i] {
			return rejected(RejectShape, "row %d (%s): pixel_shape %v, planned %v", i, s.ID, ps[3*i:3*i+3], shapes[i])
		}
	}
	return nil
}
