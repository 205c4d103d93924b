package proto

import (
	"fmt"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
)

// validator for arrays that can check offsets and UTF-8.
type fullValidator interface{ ValidateFull() error }

// ValidateRecord checks a record's contents against its schema metadata:
// no nulls (but in kept columns), list offsets in bounds, one step and micro_batch value, and each
// row's pixel count equal to the product of its pixel_shape (which equals
// the fixed shape when there is one). It returns the parsed BatchMeta with
// Step and MicroBatch from the columns (0 for an empty record).
func ValidateRecord(rec arrow.RecordBatch) (BatchMeta, error) {
	meta, err := MetaFromSchema(rec.Schema())
	if err != nil {
		return meta, err
	}
	for i, col := range rec.Columns() {
		if col.NullN() != 0 && !isKeepColumn(rec.ColumnName(i)) {
			return meta, fmt.Errorf("proto: column %s has %d nulls: %w", rec.ColumnName(i), col.NullN(), ErrSchema)
		}
		if v, ok := col.(fullValidator); ok {
			if err := v.ValidateFull(); err != nil {
				return meta, fmt.Errorf("proto: column %s: %v: %w", rec.ColumnName(i), err, ErrSchema)
			}
		}
	}
	cols := columnsByName(rec)
	if err := sameValue(cols[ColStep].(*array.Int32), &meta.Step); err != nil {
		return meta, err
	}
	if err := sameValue(cols[ColMicroBatch].(*array.Int32), &meta.MicroBatch); err != nil {
		return meta, err
	}
	if meta.Modality.hasVision() {
		if err := checkPixels(meta, cols[ColPixelValues].(*array.List), cols[ColPixelShape].(*array.FixedSizeList)); err != nil {
			return meta, err
		}
	}
	return meta, nil
}

func columnsByName(rec arrow.RecordBatch) map[string]arrow.Array {
	m := make(map[string]arrow.Array, rec.NumCols())
	for i, c := range rec.Columns() {
		m[rec.ColumnName(i)] = c
	}
	return m
}

func sameValue(a *array.Int32, dst *int) error {
	for i := range a.Len() {
		if v := int(a.Value(i)); i == 0 {
			*dst = v
		} else if v != *dst {
			return fmt.Errorf("proto: row %d has %d, row 0 has %d in one micro-batch: %w", i, v, *dst, ErrSchema)
		}
	}
	if *dst < 0 {
		return fmt.Errorf("proto: negative step/micro_batch %d: %w", *dst, ErrSchema)
	}
	return nil
}

func checkPixels(meta BatchMeta, pv *array.List, ps *array.FixedSizeList) error {
	shapes := ps.ListValues().(*array.Int32).Int32Values()[3*ps.Data().Offset():]
	if len(shapes) < 3*pv.Len() {
		return fmt.Errorf("proto: pixel_shape has %d values for %d rows: %w", len(shapes), pv.Len(), ErrSchema)
	}
	for i := range pv.Len() {
		s := shapes[3*i : 3*i+3]
		n := int64(1)
		for _, d := range s {
			if d < 0 {
				return fmt.Errorf("proto: row %d pixel_shape %v negative: %w", i, s, ErrSchema)
			}
			n *= int64(d)
		}
		if meta.Shape != nil && (int(s[0]) != meta.Shape[0] || int(s[1]) != meta.Shape[1] || int(s[2]) != meta.Shape[2]) {
			return fmt.Errorf("proto: row %d pixel_shape %v, fixed shape %v: %w", i, s, meta.Shape, ErrSchema)
		}
		start, end := pv.ValueOffsets(i)
		if IsJPEGDType(meta.DType) {
			if err := validateJPEGRow(meta.DType, s, n, end-start); err != nil {
				return fmt.Errorf("proto: row %d: %w: %w", i, err, ErrSchema)
			}
			continue
		}
		if end-start != n {
			return fmt.Errorf("proto: row %d has %d pixel values for shape %v: %w", i, end-start, s, ErrSchema)
		}
	}
	return nil
}

// ReadRows validates rec (ValidateRecord) and copies it back into Rows, the
// inverse of BuildRecord. Columns the modality lacks stay zero.
func ReadRows(rec arrow.RecordBatch) (BatchMeta, []Row, error) {
	meta, err := ValidateRecord(rec)
	if err != nil {
		return meta, nil, err
	}
	cols := columnsByName(rec)
	rows := make([]Row, rec.NumRows())
	ids := cols[ColID].(*array.String)
	cost := cols[ColCost].(*array.Float64)
	weight := cols[ColWeight].(*array.Float32)
	for i := range rows {
		// String.Value aliases the record's memory, which a Fetcher reuses
		// once the record is released: copy it, as everything else here.
		rows[i].ID, rows[i].Cost, rows[i].Weight = strings.Clone(ids.Value(i)), cost.Value(i), weight.Value(i)
	}
	if meta.Modality.hasText() {
		ii := cols[ColInputIDs].(*array.List)
		vals := ii.ListValues().(*array.Int32).Int32Values()
		tt := cols[ColTextTokens].(*array.Int32)
		for i := range rows {
			s, e := ii.ValueOffsets(i)
			rows[i].InputIDs = append([]int32{}, vals[s:e]...)
			rows[i].TextTokens = tt.Value(i)
		}
	}
	if meta.Modality.hasVision() {
		readPixels(meta, cols, rows)
	}
	readKeep(meta, cols, rows)
	return meta, rows, nil
}

func readPixels(meta BatchMeta, cols map[string]arrow.Array, rows []Row) {
	pv := cols[ColPixelValues].(*array.List)
	var buf []byte
	if b := pv.ListValues().Data().Buffers()[1]; b != nil {
		buf = b.Bytes()
	}
	off := pv.ListValues().Data().Offset()
	size := DTypeSize(meta.DType)
	ps := cols[ColPixelShape].(*array.FixedSizeList)
	shapes := ps.ListValues().(*array.Int32).Int32Values()[3*ps.Data().Offset():]
	it := cols[ColImageTokens].(*array.Int32)
	for i := range rows {
		s, e := pv.ValueOffsets(i)
		rows[i].Pixels = append([]byte{}, buf[(int(s)+off)*size:(int(e)+off)*size]...)
		copy(rows[i].PixelShape[:], shapes[3*i:3*i+3])
		rows[i].ImageTokens = it.Value(i)
	}
}
