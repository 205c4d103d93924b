package proto

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

func keepMeta(mod Modality) BatchMeta {
	m := testMeta(mod, DTypeUint8, []int{3, 2, 2})
	m.Keep = []KeepColumn{{"url", KeepUTF8}, {"label", KeepInt64}, {"score", KeepFloat64}}
	return m
}

// TestKeepColumnsRoundTrip builds records with kept columns in every
// modality, through IPC, and reads the same values back: nulls where a value
// is missing, of the wrong kind, or the row is padding.
func TestKeepColumnsRoundTrip(t *testing.T) {
	v := func(s string) KeepValue { return KeepValue{Text: s, Valid: true} }
	n := func(s string) KeepValue { return KeepValue{Text: s, Num: true, Valid: true} }
	in := [][]KeepValue{
		{v("http://x/0.jpg"), n("3"), n("0.25")},
		{n("12"), v("7"), n("1e400")}, // a number in a utf8 column is its text; text in a number column and an overflow are null
		{{}, n("2.5"), n("-4")},       // an int column refuses a fraction
		nil,                           // padding: all null
	}
	want := [][]KeepValue{
		{v("http://x/0.jpg"), n("3"), n("0.25")},
		{v("12"), {}, {}},
		{{}, {}, n("-4")},
		{{}, {}, {}},
	}
	for _, mod := range []Modality{ModalityAll, ModalityVision, ModalityText} {
		mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
		meta := keepMeta(mod)
		rows := testRows(meta, len(in))
		for i := range rows {
			rows[i].Keep = in[i]
		}
		rec, err := BuildRecord(mem, meta, rows)
		if err != nil {
			t.Fatal(err)
		}
		cols := mod.Columns()
		if got := rec.Schema().Field(len(cols)).Name; rec.NumCols() != int64(len(cols)+3) || got != "keep.url" {
			t.Errorf("%s: %d columns, first kept %q; want %d, keep.url after the modality's", mod, rec.NumCols(), got, len(cols)+3)
		}
		b, err := EncodeIPC(rec)
		rec.Release()
		if err != nil {
			t.Fatal(err)
		}
		dec, err := DecodeIPC(mem, b)
		if err != nil {
			t.Fatal(err)
		}
		gotMeta, gotRows, err := ReadRows(dec)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(gotMeta.Keep, meta.Keep) {
			t.Errorf("%s: meta keep %+v, want %+v", mod, gotMeta.Keep, meta.Keep)
		}
		for i, r := range gotRows {
			if !reflect.DeepEqual(r.Keep, want[i]) {
				t.Errorf("%s: row %d keep %+v, want %+v", mod, i, r.Keep, want[i])
			}
		}
		dec.Release()
		mem.AssertSize(t, 0)
	}
}

// TestKeepColumnsOldRecords: records without kept columns keep their exact
// schema (old shards read as before), and a hostile schema's kept columns
// are refused.
func TestKeepColumnsSchema(t *testing.T) {
	plain, err := Schema(testMeta(ModalityAll, DTypeUint8, nil))
	if err != nil {
		t.Fatal(err)
	}
	if plain.NumFields() != len(ModalityAll.Columns()) {
		t.Errorf("a meta without Keep has %d fields, want %d", plain.NumFields(), len(ModalityAll.Columns()))
	}
	good, err := Schema(keepMeta(ModalityAll))
	if err != nil {
		t.Fatal(err)
	}
	md := good.Metadata()
	fields := good.Fields()
	for _, tc := range []struct {
		name   string
		fields []arrow.Field
	}{
		{"bad type", append(fields[:len(fields):len(fields)], arrow.Field{Name: "keep.x", Type: arrow.PrimitiveTypes.Int32, Nullable: true})},
		{"bad name", append(fields[:len(fields):len(fields)], arrow.Field{Name: "keep.a b", Type: arrow.BinaryTypes.String, Nullable: true})},
		{"twice", append(fields[:len(fields):len(fields)], fields[len(fields)-1])},
		{"between core columns", append([]arrow.Field{fields[len(fields)-1]}, fields[:len(fields)-1]...)},
		{"core column after", append(fields[:len(fields):len(fields)], fields[0])},
	} {
		_, err := MetaFromSchema(arrow.NewSchema(tc.fields, &md))
		if !errors.Is(err, ErrSchema) {
			t.Errorf("%s: MetaFromSchema = %v, want ErrSchema", tc.name, err)
		}
	}
	for _, bad := range [][]KeepColumn{{{"", KeepUTF8}}, {{"a", "int32"}}, {{"a", KeepUTF8}, {"a", KeepInt64}}, {{"x/y", KeepUTF8}}} {
		m := testMeta(ModalityText, "", nil)
		m.Keep = bad
		if err := m.Validate(); !errors.Is(err, ErrInvalidMeta) {
			t.Errorf("keep %+v: Validate = %v, want ErrInvalidMeta", bad, err)
		}
	}
	m := keepMeta(ModalityText)
	rows := testRows(m, 2)
	rows[0].Keep = []KeepValue{{Text: "one", Valid: true}}
	if _, err := BuildRecord(memory.NewGoAllocator(), m, rows); !errors.Is(err, ErrInvalidRow) {
		t.Errorf("a row with 1 kept value for 3 columns: %v, want ErrInvalidRow", err)
	}
}

// TestKeepColumnsInvalidUTF8: a kept string is repaired, so the record
// passes ValidateRecord's UTF-8 check.
func TestKeepColumnsInvalidUTF8(t *testing.T) {
	m := keepMeta(ModalityText)
	rows := testRows(m, 1)
	rows[0].Keep = []KeepValue{{Text: "a\xffb", Valid: true}, {}, {}}
	rec, err := BuildRecord(memory.NewGoAllocator(), m, rows)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Release()
	if _, err := ValidateRecord(rec); err != nil {
		t.Fatal(err)
	}
	if got := rec.Column(len(ModalityText.Columns())).(*array.String).Value(0); got != "a\uFFFDb" {
		t.Errorf("kept %q, want a\\uFFFDb", got)
	}
}

// TestKeepPrefixMatchesTrainer: the column prefix is defined once for Go and Python.
func TestKeepPrefixMatchesTrainer(t *testing.T) {
	raw, err := os.ReadFile("../trainer/mmfeed_trainer/schema_keys.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Prefix string `json:"keep_column_prefix"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Prefix != KeepPrefix {
		t.Errorf("schema_keys.json keep_column_prefix %q, proto KeepPrefix %q", doc.Prefix, KeepPrefix)
	}
}
