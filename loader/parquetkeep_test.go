package loader

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// keepRecord is a table of three rows with kept columns: url (a null in
// row 1) and meta, a struct whose label is an int (meta null in row 2).
func keepRecord(mem memory.Allocator) (*arrow.Schema, arrow.RecordBatch) {
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
	return sc, b.NewRecordBatch()
}

// writeKeepParquet writes keepRecord to a Parquet file in dir.
func writeKeepParquet(t *testing.T, mem memory.Allocator, dir string) string {
	t.Helper()
	sc, rec := keepRecord(mem)
	defer rec.Release()
	p := filepath.Join(dir, "k.parquet")
	f, err := os.Create(p)
	must(t, err)
	w, err := pqarrow.NewFileWriter(sc, f, parquet.NewWriterProperties(), pqarrow.NewArrowWriterProperties(pqarrow.WithAllocator(mem)))
	must(t, err)
	must(t, w.Write(rec))
	must(t, w.Close())
	_ = f.Close() // pqarrow's writer closed it
	return p
}

// writeKeepArrow writes keepRecord as an HF save_to_disk folder in dir (an
// Arrow IPC stream, as datasets writes it, with its two JSON files).
func writeKeepArrow(t *testing.T, mem memory.Allocator, dir string) string {
	t.Helper()
	sc, rec := keepRecord(mem)
	defer rec.Release()
	f, err := os.Create(filepath.Join(dir, "data-00000-of-00001.arrow"))
	must(t, err)
	w := ipc.NewWriter(f, ipc.WithSchema(sc), ipc.WithAllocator(mem))
	must(t, w.Write(rec))
	must(t, w.Close())
	must(t, f.Close())
	must(t, os.WriteFile(filepath.Join(dir, "dataset_info.json"), []byte(`{"features": {}}`), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "state.json"), []byte(`{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}`), 0o644))
	return dir
}

// TestTableKeeps: a Parquet file and an HF save_to_disk folder (Arrow) keep
// top-level columns by name and paths into a struct column
// (json:meta.label), typed over the index, with nulls and absent columns
// missing. Before, an Arrow source kept only the caption.
func TestTableKeeps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(*testing.T, memory.Allocator, string) string
	}{{"parquet", writeKeepParquet}, {"arrow", writeKeepArrow}} {
		t.Run(tc.name, func(t *testing.T) {
			mem := memory.NewCheckedAllocator(memory.DefaultAllocator)
			defer mem.AssertSize(t, 0)
			checkTableKeeps(t, tc.write(t, mem, t.TempDir()))
		})
	}
}

func checkTableKeeps(t *testing.T, p string) {
	t.Helper()
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
}

// TestParquetKeepBound: a kept column counts against the row group's byte
// bound.
func TestParquetKeepBound(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.DefaultAllocator)
	defer mem.AssertSize(t, 0)
	p := writeKeepParquet(t, mem, t.TempDir())
	fields, err := ParseKeep("url,json:meta.label,caption,absent")
	must(t, err)

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
