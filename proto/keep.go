package proto

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// Kept columns carry source fields beside the tensors (mmfeed --keep): one
// nullable column per BatchMeta.Keep entry, named KeepPrefix + its name,
// after the modality's columns, in every modality's record. A record
// without kept columns is exactly the schema-version-1 record it always
// was, so old shards read unchanged; a reader that predates kept columns
// refuses a record that has them (ErrSchema: unexpected columns).
const KeepPrefix = "keep."

// Kept column types (KeepColumn.Type): Arrow utf8, int64 and float64.
const (
	KeepUTF8    = "utf8"
	KeepInt64   = "int64"
	KeepFloat64 = "float64"
)

// KeepColumn is one kept column: Name without KeepPrefix (1 to 64 bytes of
// A-Z a-z 0-9 _ . -) and its type.
type KeepColumn struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// KeepValue is one row's value of a kept column: a string's text, or a
// number's decimal text (Num set); Valid false is null. BuildRecord
// converts it to the column's type: utf8 takes Text (a number as its
// text); int64 and float64 take a Num that parses as one (else null).
type KeepValue struct {
	Text  string
	Num   bool
	Valid bool
}

func keepArrowType(t string) arrow.DataType {
	switch t {
	case KeepUTF8:
		return arrow.BinaryTypes.String
	case KeepInt64:
		return arrow.PrimitiveTypes.Int64
	case KeepFloat64:
		return arrow.PrimitiveTypes.Float64
	}
	return nil
}

func keepTypeOf(dt arrow.DataType) string {
	switch dt.ID() {
	case arrow.STRING:
		return KeepUTF8
	case arrow.INT64:
		return KeepInt64
	case arrow.FLOAT64:
		return KeepFloat64
	}
	return ""
}

// validateKeep checks the names (unique, plain) and types of kept columns.
func validateKeep(cols []KeepColumn) error {
	seen := make(map[string]bool, len(cols))
	for _, c := range cols {
		if c.Name == "" || len(c.Name) > 64 || strings.Trim(c.Name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") != "" {
			return fmt.Errorf("proto: kept column name %q (want 1 to 64 of A-Z a-z 0-9 _ . -): %w", c.Name, ErrInvalidMeta)
		}
		if seen[c.Name] {
			return fmt.Errorf("proto: kept column %q twice: %w", c.Name, ErrInvalidMeta)
		}
		seen[c.Name] = true
		if keepArrowType(c.Type) == nil {
			return fmt.Errorf("proto: kept column %q type %q (want utf8|int64|float64): %w", c.Name, c.Type, ErrInvalidMeta)
		}
	}
	return nil
}

// keepFields are the schema fields of the kept columns.
func keepFields(cols []KeepColumn) []arrow.Field {
	out := make([]arrow.Field, len(cols))
	for i, c := range cols {
		out[i] = arrow.Field{Name: KeepPrefix + c.Name, Type: keepArrowType(c.Type), Nullable: true}
	}
	return out
}

// parseKeepColumns reads the kept columns of s: every field from the first
// one named KeepPrefix+... on (any other field there is left for sameFields
// to refuse).
func parseKeepColumns(s *arrow.Schema) ([]KeepColumn, error) {
	var out []KeepColumn
	for _, f := range s.Fields() {
		name, ok := strings.CutPrefix(f.Name, KeepPrefix)
		if !ok {
			if out != nil {
				break
			}
			continue
		}
		out = append(out, KeepColumn{Name: name, Type: keepTypeOf(f.Type)})
	}
	if err := validateKeep(out); err != nil {
		return nil, fmt.Errorf("%w: %w", err, ErrSchema)
	}
	return out, nil
}

func isKeepColumn(name string) bool { return strings.HasPrefix(name, KeepPrefix) }

// buildKeep builds kept column i of meta from the rows (a row without Keep
// values is null in every kept column: the padding rows).
func buildKeep(mem memory.Allocator, meta BatchMeta, i int, rows []Row) arrow.Array {
	get := func(r int) (KeepValue, bool) {
		if len(rows[r].Keep) == 0 {
			return KeepValue{}, false
		}
		v := rows[r].Keep[i]
		return v, v.Valid
	}
	switch meta.Keep[i].Type {
	case KeepInt64:
		b := array.NewInt64Builder(mem)
		defer b.Release()
		for r := range rows {
			v, ok := get(r)
			n, err := strconv.ParseInt(v.Text, 10, 64)
			if ok && v.Num && err == nil {
				b.Append(n)
			} else {
				b.AppendNull()
			}
		}
		return b.NewArray()
	case KeepFloat64:
		b := array.NewFloat64Builder(mem)
		defer b.Release()
		for r := range rows {
			v, ok := get(r)
			f, err := strconv.ParseFloat(v.Text, 64)
			if ok && v.Num && err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
				b.Append(f)
			} else {
				b.AppendNull()
			}
		}
		return b.NewArray()
	}
	b := array.NewStringBuilder(mem)
	defer b.Release()
	for r := range rows {
		if v, ok := get(r); ok {
			b.Append(strings.ToValidUTF8(v.Text, "\uFFFD"))
		} else {
			b.AppendNull()
		}
	}
	return b.NewArray()
}

// readKeep copies the kept columns of rec into rows[i].Keep (nothing when
// the record has none).
func readKeep(meta BatchMeta, cols map[string]arrow.Array, rows []Row) {
	if len(meta.Keep) == 0 {
		return
	}
	for i := range rows {
		rows[i].Keep = make([]KeepValue, len(meta.Keep))
	}
	for k, c := range meta.Keep {
		col := cols[KeepPrefix+c.Name]
		for i := range rows {
			if col.IsNull(i) {
				continue
			}
			var v KeepValue
			switch a := col.(type) {
			case *array.String:
				v = KeepValue{Text: strings.Clone(a.Value(i)), Valid: true}
			case *array.Int64:
				v = KeepValue{Text: strconv.FormatInt(a.Value(i), 10), Num: true, Valid: true}
			case *array.Float64:
				v = KeepValue{Text: strconv.FormatFloat(a.Value(i), 'g', -1, 64), Num: true, Valid: true}
			}
			rows[i].Keep[k] = v
		}
	}
}
