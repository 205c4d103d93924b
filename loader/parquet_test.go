package loader

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// pqRow is one row to write; nil pointers become nulls.
type pqRow struct {
	id   string
	img  *string
	text *string
	path string
}

func ptr(s string) *string { return &s }

// writeParquet writes rows with the image column as plain binary or as a
// HuggingFace struct{bytes, path}, rowsPerGroup rows per row group.
func writeParquet(t testing.TB, p string, rows []pqRow, hfStruct bool, rowsPerGroup int) {
	t.Helper()
	mem := memory.NewCheckedAllocator(memory.DefaultAllocator)
	defer mem.AssertSize(t, 0)
	imgType := arrow.DataType(arrow.BinaryTypes.Binary)
	if hfStruct {
		imgType = arrow.StructOf(
			arrow.Field{Name: "bytes", Type: arrow.BinaryTypes.Binary, Nullable: true},
			arrow.Field{Name: "path", Type: arrow.BinaryTypes.String, Nullable: true})
	}
	sc := arrow.NewSchema([]arrow.Field{
		{Name: "id", Type: arrow.BinaryTypes.String, Nullable: true},
		{Name: "image", Type: imgType, Nullable: true},
		{Name: "text", Type: arrow.BinaryTypes.String, Nullable: true},
	}, nil)
	b := array.NewRecordBuilder(mem, sc)
	defer b.Release()
	for _, r := range rows {
		b.Field(0).(*array.StringBuilder).Append(r.id)
		appendImage(b.Field(1), r, hfStruct)
		if r.text == nil {
			b.Field(2).AppendNull()
		} else {
			b.Field(2).(*array.StringBuilder).Append(*r.text)
		}
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	f, err := os.Create(p)
	must(t, err)
	defer f.Close()
	props := parquet.NewWriterProperties(parquet.WithMaxRowGroupLength(int64(rowsPerGroup)))
	w, err := pqarrow.NewFileWriter(sc, f, props, pqarrow.NewArrowWriterProperties(pqarrow.WithAllocator(mem)))
	must(t, err)
	must(t, w.Write(rec))
	must(t, w.Close())
}

func appendImage(b array.Builder, r pqRow, hfStruct bool) {
	if !hfStruct {
		if r.img == nil {
			b.AppendNull()
		} else {
			b.(*array.BinaryBuilder).Append([]byte(*r.img))
		}
		return
	}
	sb := b.(*array.StructBuilder)
	sb.Append(true)
	if r.img == nil {
		sb.FieldBuilder(0).AppendNull()
	} else {
		sb.FieldBuilder(0).(*array.BinaryBuilder).Append([]byte(*r.img))
	}
	sb.FieldBuilder(1).(*array.StringBuilder).Append(r.path)
}

func TestParquetSource(t *testing.T) {
	rows := []pqRow{
		{id: "r0", img: ptr("img0"), text: ptr("zero"), path: "dir/0.jpg"},
		{id: "", img: ptr("img1"), text: ptr("one"), path: "1.png"},
		{id: "r2", img: nil, text: ptr("null image")},
		{id: "r3", img: ptr("img3"), text: nil},
		{id: "r4", img: ptr("img4"), text: ptr(" ")},
		{id: "r5", img: ptr(""), text: ptr("empty image")},
		{id: "r6", img: ptr("img6-too-large"), text: ptr("big")},
		{id: "r7", img: ptr("img7"), text: ptr("seven")},
	}
	for _, hf := range []bool{false, true} {
		t.Run("hfStruct="+strconv.FormatBool(hf), func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "part-0.parquet")
			writeParquet(t, p, rows, hf, 3)
			d := drain(t, p, Options{MaxImageBytes: 10})
			want := []struct{ id, text, img, loc string }{
				{"r0", "zero", "img0", p + ":rg0:row0"},
				{DeriveID("part-0.parquet", "row1"), "one", "img1", p + ":rg0:row1"},
				{"r7", "seven", "img7", p + ":rg2:row1"},
			}
			if len(d.samples) != len(want) {
				t.Fatalf("got %v, want %d samples", ids(d.samples), len(want))
			}
			for i, w := range want {
				s := d.samples[i]
				if s.ID != w.id || s.Text != w.text || string(s.Image) != w.img || s.Location != w.loc {
					t.Errorf("sample %d: got %+v, want %+v", i, s, w)
				}
			}
			if hf && d.samples[0].ImageName != "0.jpg" {
				t.Errorf("ImageName: got %q, want 0.jpg", d.samples[0].ImageName)
			}
			wantReasons := map[string]string{"r2": ReasonMissingImage, "r3": ReasonMissingCaption,
				"r4": ReasonEmptyCaption, "r5": ReasonEmptyImage, "r6": ReasonTooLarge}
			for _, r := range d.rejects {
				if wantReasons[r.ID] != r.Reason {
					t.Errorf("reject %+v: want reason %q", r, wantReasons[r.ID])
				}
			}
			if len(d.rejects) != len(wantReasons) {
				t.Errorf("got %d rejects, want %d", len(d.rejects), len(wantReasons))
			}
		})
	}
}

func TestParquetColumnsAndSchema(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.parquet")
	writeParquet(t, p, []pqRow{{id: "x", img: ptr("i"), text: ptr("t")}}, false, 10)
	writeParquet(t, filepath.Join(dir, "b.parquet"), []pqRow{{id: "y", img: ptr("j"), text: ptr("u")}}, false, 10)
	hf := filepath.Join(t.TempDir(), "hf.parquet")
	writeParquet(t, hf, []pqRow{{id: "z", img: ptr("k"), text: ptr("v")}}, true, 10)
	tests := []struct {
		name    string
		path    string
		opts    Options
		wantIDs int
		wantErr error
	}{
		{"folder", dir, Options{}, 2, nil},
		{"glob", filepath.Join(dir, "*.parquet"), Options{}, 2, nil},
		{"text column renamed", p, Options{TextColumn: "id"}, 1, nil},
		{"missing image column", p, Options{ImageColumn: "jpg"}, 0, ErrSchema},
		{"struct bytes field", hf, Options{ImageColumn: "image.bytes"}, 1, nil},
		{"bytes of a binary column", p, Options{ImageColumn: "image.bytes"}, 0, ErrSchema},
		{"text column not string", p, Options{TextColumn: "image"}, 0, ErrSchema},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, err := Open(tt.path, tt.opts)
			must(t, err)
			defer src.Close()
			n := 0
			for {
				_, err = src.Next(context.Background())
				if err != nil {
					break
				}
				n++
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Errorf("got err %v, want %v", err, tt.wantErr)
				}
				return
			}
			if n != tt.wantIDs {
				t.Errorf("got %d samples (err %v), want %d", n, err, tt.wantIDs)
			}
		})
	}
}
