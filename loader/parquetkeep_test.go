package loader

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// TestParquetKeeps: a Parquet source keeps top-level columns by name and
// paths into a struct column (json:meta.label), typed over the index, with
// nulls and absent columns missing; a kept column counts against the row
// group's byte bound.
func TestParquetKeeps(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.DefaultAllocator)
	defer mem.AssertSize(t, 0)
	meta := arrow.StructOf(arrow.Field{Name: "label", Type: arrow.PrimitiveTypes.Int64, Nullable: true})
	sc := arrow.NewSchema([]arrow.Field{
		{Name: "image", Type: arrow.BinaryTypes.Binary},
		{Name: "text", Type: arrow.BinaryTypes.String},
		{Name: "url", Type: arrow.BinaryTypes.String, Nullable: true},
		{Name: "meta", Type: meta, Nullable: true},
	}, nil)
	b := array.NewRecordBuilder(mem, sc)
	defer b.Release()
	for i, r := range []struct {
		url   *string
		label int64
		nullM bool
	}{{ptr("http://e/0.jpg"), 4, false}, {nil, 7, false}, {ptr("http://e/2.jpg"), 0, true}} {
		b.Field(0).(*array.BinaryBuilder).Append([]byte{'i', byte('0' + i)})
		b.Field(1).(*array.StringBuilder).Append("caption " + string(rune('0'+i)))
		if r.url == nil {
			b.Field(2).AppendNull()
		} else {
			b.Field(2).(*array.StringBuilder).Append(*r.url)
		}
		sb := b.Field(3).(*array.StructBuilder)
		if r.nullM {
			sb.AppendNull()
		} else {
			sb.Append(true)
			sb.FieldBuilder(0).(*array.Int64Builder).Append(r.label)
		}
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	p := filepath.Join(t.TempDir(), "k.parquet")
	f, err := os.Create(p)
	must(t, err)
	w, err := pqarrow.NewFileWriter(sc, f, parquet.NewWriterProperties(), pqarrow.NewArrowWriterProperties(pqarrow.WithAllocator(mem)))
	must(t, err)
	must(t, w.Write(rec))
	must(t, w.Close())
	_ = f.Close() // pqarrow's writer closed it

	fields, err := ParseKeep("url,json:meta.label,caption,absent")
	must(t, err)
	opts := DefaultOptions()
	opts.Keep = fields
	ix, err := BuildIndex(context.Background(), p, opts)
	must(t, err)
	defer ix.Close()
	v := func(s string) KeepValue { return KeepValue{Text: s, Valid: true} }
	n := func(s string) KeepValue { return KeepValue{Text: s, Num: true, Valid: true} }
	want := [][]KeepValue{
		{v("http://e/0.jpg"), n("4"), v("caption 0"), {}},
		{{}, n("7"), v("caption 1"), {}},
		{v("http://e/2.jpg"), {}, v("caption 2"), {}},
	}
	var got [][]KeepValue
	for _, e := range ix.All() {
		got = append(got, ix.Kept(e))
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("kept %+v,\nwant %+v", got, want)
	}
	if types := ix.KeepTypes(); !reflect.DeepEqual(types, []KeepType{KeepString, KeepInt, KeepString, KeepString}) {
		t.Errorf("types %v", types)
	}
	if missing := ix.KeepMissing(); !reflect.DeepEqual(missing, []int64{1, 1, 0, 3}) {
		t.Errorf("missing %v", missing)
	}

	// The smallest row-group bound the image and text columns fit: the kept
	// columns (a longer url column) exceed it, so with them the group is refused.
	count := func(keep []KeepField, bound int64) int {
		o := DefaultOptions()
		o.Keep, o.MaxRowGroupBytes = keep, bound
		ix, err := BuildIndex(context.Background(), p, o)
		if err != nil {
			return 0
		}
		defer ix.Close()
		return ix.Len()
	}
	bound := int64(1)
	for count(nil, bound) < 3 {
		bound++
	}
	if got := count(fields, bound); got != 0 {
		t.Errorf("%d entries at a row-group bound of %d bytes that the kept columns exceed, want 0", got, bound)
	}
}
