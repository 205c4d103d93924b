package pipeline

import (
	"os"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

type pqRow struct {
	id, text string
	img      []byte
}

// writeHostileParquet writes rows as id (string), image (binary), text
// (string), in row groups of 8.
func writeHostileParquet(t *testing.T, p string, rows []pqRow) {
	sc := arrow.NewSchema([]arrow.Field{
		{Name: "id", Type: arrow.BinaryTypes.String},
		{Name: "image", Type: arrow.BinaryTypes.Binary},
		{Name: "text", Type: arrow.BinaryTypes.String},
	}, nil)
	writeRecord(t, p, sc, func(b *array.RecordBuilder) {
		for _, r := range rows {
			b.Field(0).(*array.StringBuilder).Append(r.id)
			b.Field(1).(*array.BinaryBuilder).Append(r.img)
			b.Field(2).(*array.StringBuilder).Append(r.text)
		}
	})
}

// writeWrongTypes writes a Parquet file whose image and text columns are
// integers.
func writeWrongTypes(t *testing.T, p string) {
	sc := arrow.NewSchema([]arrow.Field{
		{Name: "image", Type: arrow.PrimitiveTypes.Int64},
		{Name: "text", Type: arrow.PrimitiveTypes.Int64},
	}, nil)
	writeRecord(t, p, sc, func(b *array.RecordBuilder) {
		b.Field(0).(*array.Int64Builder).Append(1)
		b.Field(1).(*array.Int64Builder).Append(2)
	})
}

func writeRecord(t *testing.T, p string, sc *arrow.Schema, fill func(*array.RecordBuilder)) {
	t.Helper()
	mem := memory.NewCheckedAllocator(memory.DefaultAllocator)
	defer mem.AssertSize(t, 0)
	b := array.NewRecordBuilder(mem, sc)
	defer b.Release()
	fill(b)
	rec := b.NewRecordBatch()
	defer rec.Release()
	f, err := os.Create(p)
	mustOK(t, err)
	defer f.Close()
	w, err := pqarrow.NewFileWriter(sc, f, parquet.NewWriterProperties(parquet.WithMaxRowGroupLength(8)),
		pqarrow.NewArrowWriterProperties(pqarrow.WithAllocator(mem)))
	mustOK(t, err)
	mustOK(t, w.Write(rec))
	mustOK(t, w.Close())
}
