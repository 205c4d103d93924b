package loader

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// hfRow is one row of an HF Image dataset: image bytes (nil: null) and the
// path datasets keeps beside them, and the caption.
type hfRow struct {
	img     []byte
	path    string
	caption string
}

// hfSchema is what datasets writes for features {"image": Image(),
// "caption": Value("string")}, its feature metadata included.
func hfSchema() *arrow.Schema {
	md := arrow.NewMetadata([]string{"huggingface"},
		[]string{`{"info": {"features": {"image": {"_type": "Image"}, "caption": {"dtype": "string", "_type": "Value"}}}}`})
	return arrow.NewSchema([]arrow.Field{
		{Name: "image", Type: arrow.StructOf(
			arrow.Field{Name: "bytes", Type: arrow.BinaryTypes.Binary, Nullable: true},
			arrow.Field{Name: "path", Type: arrow.BinaryTypes.String, Nullable: true}), Nullable: true},
		{Name: "caption", Type: arrow.BinaryTypes.String, Nullable: true},
	}, &md)
}

// hfRecord builds one record batch of rows.
func hfRecord(rows []hfRow) arrow.RecordBatch {
	b := array.NewRecordBuilder(memory.DefaultAllocator, hfSchema())
	defer b.Release()
	for _, r := range rows {
		sb := b.Field(0).(*array.StructBuilder)
		sb.Append(true)
		if r.img == nil {
			sb.FieldBuilder(0).AppendNull()
		} else {
			sb.FieldBuilder(0).(*array.BinaryBuilder).Append(r.img)
		}
		sb.FieldBuilder(1).(*array.StringBuilder).Append(r.path)
		b.Field(1).(*array.StringBuilder).Append(r.caption)
	}
	return b.NewRecordBatch()
}

// writeArrowStream writes batches as an Arrow IPC stream (what datasets'
// ArrowWriter writes) or, with fileFormat, an Arrow IPC file.
func writeArrowStream(t testing.TB, p string, batches [][]hfRow, fileFormat bool) {
	t.Helper()
	f, err := os.Create(p)
	must(t, err)
	defer f.Close()
	type recWriter interface {
		Write(arrow.RecordBatch) error
		Close() error
	}
	var w recWriter = ipc.NewWriter(f, ipc.WithSchema(hfSchema()))
	if fileFormat {
		fw, err := ipc.NewFileWriter(f, ipc.WithSchema(hfSchema()))
		must(t, err)
		w = fw
	}
	for _, rows := range batches {
		rec := hfRecord(rows)
		must(t, w.Write(rec))
		rec.Release()
	}
	must(t, w.Close())
}

// writeHFDisk writes a save_to_disk folder: one data file per element of
// shards (each a list of record batches), state.json and dataset_info.json
// laid out as datasets 5.2 writes them.
func writeHFDisk(t testing.TB, dir string, shards [][][]hfRow) {
	t.Helper()
	must(t, os.MkdirAll(dir, 0o755))
	var files []string
	for i, batches := range shards {
		name := fmt.Sprintf("data-%05d-of-%05d.arrow", i, len(shards))
		writeArrowStream(t, filepath.Join(dir, name), batches, false)
		files = append(files, fmt.Sprintf("    {\n      \"filename\": %q\n    }", name))
	}
	state := "{\n  \"_data_files\": [\n" + strings.Join(files, ",\n") + "\n  ],\n" +
		"  \"_fingerprint\": \"577bc7226b2dde98\",\n  \"_format_columns\": null,\n  \"_format_kwargs\": {},\n" +
		"  \"_format_type\": null,\n  \"_output_all_columns\": false,\n  \"_split\": null\n}"
	writeFile(t, filepath.Join(dir, HFStateFile), []byte(state))
	info := `{
  "citation": "",
  "description": "",
  "features": {
    "image": {
      "_type": "Image"
    },
    "caption": {
      "dtype": "string",
      "_type": "Value"
    }
  },
  "homepage": "",
  "license": ""
}`
	writeFile(t, filepath.Join(dir, HFInfoFile), []byte(info))
}

// hfRows makes n rows with images "img-<prefix><i>" and captions.
func hfRows(prefix string, n int) []hfRow {
	out := make([]hfRow, n)
	for i := range out {
		out[i] = hfRow{img: []byte(fmt.Sprintf("img-%s%d", prefix, i)), path: fmt.Sprintf("%s%d.jpg", prefix, i), caption: fmt.Sprintf("caption %s%d", prefix, i)}
	}
	return out
}

func TestHFDiskRead(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ds")
	// state.json's order, not the names' order, is the dataset's order
	writeHFDisk(t, dir, [][][]hfRow{{hfRows("a", 3), hfRows("b", 2)}, {hfRows("c", 4)}})
	opts := Options{TextColumn: "caption"}
	d := drain(t, dir, opts)
	var got []string
	for _, s := range d.samples {
		got = append(got, string(s.Image)+"|"+s.Text+"|"+s.ImageName)
	}
	var want []string
	for _, r := range append(append(hfRows("a", 3), hfRows("b", 2)...), hfRows("c", 4)...) {
		want = append(want, string(r.img)+"|"+r.caption+"|"+r.path)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("samples:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(d.rejects) != 0 {
		t.Errorf("rejects %+v", d.rejects)
	}
	file0 := filepath.Join(dir, "data-00000-of-00002.arrow")
	if s := d.samples[4]; s.Location != file0+":b1:row1" || s.ID != DeriveID("data-00000-of-00002.arrow", "row4") {
		t.Errorf("sample 4: location %s id %s", s.Location, s.ID)
	}

	ix, err := BuildIndex(context.Background(), dir, opts)
	must(t, err)
	defer ix.Close()
	if ix.Len() != len(want) {
		t.Fatalf("index holds %d entries, want %d", ix.Len(), len(want))
	}
	for _, i := range []int{8, 0, 4, 3, 6, 1} { // out of order: each read finds its batch by offset
		img, err := ix.ReadImage(ix.Entry(i))
		if err != nil || string(img)+"|"+ix.Entry(i).Text+"|"+ix.Entry(i).ImageName != want[i] {
			t.Errorf("ReadImage(%d) = %q, %v; want %s", i, img, err, want[i])
		}
	}
}

func TestHFDiskDetection(t *testing.T) {
	root := t.TempDir()
	writeHFDisk(t, filepath.Join(root, "dd", "train"), [][][]hfRow{{hfRows("t", 2)}})
	writeFile(t, filepath.Join(root, "dd", HFDictFile), []byte(`{"splits": ["train", "test"]}`))
	writeHFDisk(t, filepath.Join(root, "esc"), [][][]hfRow{{hfRows("e", 1)}})
	writeFile(t, filepath.Join(root, "esc", HFStateFile), []byte(`{"_data_files": [{"filename": "../x.arrow"}]}`))
	writeHFDisk(t, filepath.Join(root, "cols"), [][][]hfRow{{hfRows("c", 1)}})
	writeArrowStream(t, filepath.Join(root, "single.arrow"), [][]hfRow{hfRows("s", 2)}, true)
	cases := []struct {
		path, want string
		err        error
		samples    int
		opts       Options
	}{
		{path: "dd", err: ErrUnknownFormat, want: "name one split folder, e.g. " + filepath.Join(root, "dd", "train")},
		{path: "dd/train", samples: 2, opts: Options{TextColumn: "caption"}},
		{path: "esc", err: ErrUnknownFormat, want: `"../x.arrow"`},
		{path: "cols", err: ErrSchema, want: "Image features [image] and string features [caption]"},
		{path: "single.arrow", samples: 2, opts: Options{TextColumn: "caption"}},
	}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			ix, err := BuildIndex(context.Background(), filepath.Join(root, c.path), c.opts)
			if c.err != nil {
				if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("err %v, want %v containing %s", err, c.err, c.want)
				}
				return
			}
			must(t, err)
			defer ix.Close()
			if ix.Len() != c.samples {
				t.Fatalf("%d entries, want %d", ix.Len(), c.samples)
			}
			if _, err := ix.ReadImage(ix.Entry(c.samples - 1)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestHFDiskHostile cuts, bloats and corrupts data files: each keeps the
// batches before the damage and quarantines the rest with one reject.
func TestHFDiskHostile(t *testing.T) {
	root := t.TempDir()
	build := func(name string, damage func(p string, size int64)) string {
		dir := filepath.Join(root, name)
		writeHFDisk(t, dir, [][][]hfRow{{hfRows("a", 2), hfRows("b", 2)}})
		p := filepath.Join(dir, "data-00000-of-00001.arrow")
		fi, err := os.Stat(p)
		must(t, err)
		damage(p, fi.Size())
		return dir
	}
	cut := build("cut", func(p string, size int64) { must(t, os.Truncate(p, size-40)) })
	garbage := build("garbage", func(p string, _ int64) { writeFile(t, p, []byte("not arrow at all, not at all")) })
	big := build("big", func(string, int64) {})
	fifo := build("fifo", func(p string, _ int64) { must(t, os.Remove(p)); mkfifo(t, p) })
	cases := []struct {
		dir     string
		opts    Options
		samples int
		reason  string
	}{
		{cut, Options{}, 2, ReasonBadArrowFile},
		{garbage, Options{}, 0, ReasonBadArrowFile},
		{big, Options{MaxRowGroupBytes: 16}, 0, ReasonTooLarge},
	}
	for _, c := range cases {
		t.Run(filepath.Base(c.dir), func(t *testing.T) {
			c.opts.TextColumn = "caption"
			var rejects []Reject
			c.opts.OnReject = func(r Reject) { rejects = append(rejects, r) }
			ix, err := BuildIndex(context.Background(), c.dir, c.opts)
			if c.samples == 0 {
				if len(rejects) != 1 || rejects[0].Reason != c.reason {
					t.Fatalf("err %v, rejects %+v; want one %s", err, rejects, c.reason)
				}
				return
			}
			must(t, err)
			defer ix.Close()
			if ix.Len() != c.samples || len(rejects) != 1 || rejects[0].Reason != c.reason {
				t.Fatalf("%d entries, rejects %+v; want %d and one %s", ix.Len(), rejects, c.samples, c.reason)
			}
		})
	}
	t.Run("fifo", func(t *testing.T) {
		_, err := BuildIndex(context.Background(), fifo, Options{TextColumn: "caption"})
		if !errors.Is(err, ErrNotRegular) {
			t.Fatalf("err %v, want ErrNotRegular", err)
		}
	})
}

// TestHFDiskImagePaths reads rows that keep only a path (an image that
// datasets could not embed) under the same rules as Parquet's.
func TestHFDiskImagePaths(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ds")
	writeHFDisk(t, dir, [][][]hfRow{{{{path: "imgs/a.jpg", caption: "a"}, {path: "../b.jpg", caption: "b"}}}})
	writeFile(t, filepath.Join(dir, "imgs", "a.jpg"), []byte("AAAA"))
	writeFile(t, filepath.Join(dir, "..", "b.jpg"), []byte("BBBB"))
	d := drain(t, dir, Options{TextColumn: "caption"})
	if len(d.samples) != 1 || string(d.samples[0].Image) != "AAAA" || len(d.rejects) != 1 || d.rejects[0].Reason != ReasonEscapesRoot {
		t.Fatalf("samples %+v rejects %+v", d.samples, d.rejects)
	}
}

// writeArrowText writes one row {image: binary, text: string} as an Arrow IPC stream.
func writeArrowText(t testing.TB, p, img, text string) {
	t.Helper()
	sc := arrow.NewSchema([]arrow.Field{
		{Name: "image", Type: arrow.BinaryTypes.Binary}, {Name: "text", Type: arrow.BinaryTypes.String}}, nil)
	b := array.NewRecordBuilder(memory.DefaultAllocator, sc)
	defer b.Release()
	b.Field(0).(*array.BinaryBuilder).Append([]byte(img))
	b.Field(1).(*array.StringBuilder).Append(text)
	rec := b.NewRecordBatch()
	defer rec.Release()
	f, err := os.Create(p)
	must(t, err)
	defer f.Close()
	w := ipc.NewWriter(f, ipc.WithSchema(sc))
	must(t, w.Write(rec))
	must(t, w.Close())
}
