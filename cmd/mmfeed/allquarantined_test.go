package main

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// writeManifest writes a manifest of lines (and files: name → bytes) in a new folder.
func writeManifest(t *testing.T, files map[string][]byte, lines ...string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		must(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
	}
	p := filepath.Join(dir, "manifest.jsonl")
	must(t, os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	return p
}

// writeHFParquet writes n rows of an HF Image struct column "image" whose
// bytes and path are null and a text column named textCol (null when
// nullText).
func writeHFParquet(t *testing.T, n int, textCol string, nullText bool) string {
	t.Helper()
	sc := arrow.NewSchema([]arrow.Field{
		{Name: "image", Type: arrow.StructOf(
			arrow.Field{Name: "bytes", Type: arrow.BinaryTypes.Binary, Nullable: true},
			arrow.Field{Name: "path", Type: arrow.BinaryTypes.String, Nullable: true}), Nullable: true},
		{Name: textCol, Type: arrow.BinaryTypes.String, Nullable: true},
	}, nil)
	b := array.NewRecordBuilder(memory.DefaultAllocator, sc)
	defer b.Release()
	for i := range n {
		sb := b.Field(0).(*array.StructBuilder)
		sb.Append(true)
		if nullText { // the image is there; the caption is not
			sb.FieldBuilder(0).(*array.BinaryBuilder).Append(pngBytes(t))
		} else {
			sb.FieldBuilder(0).AppendNull()
		}
		sb.FieldBuilder(1).AppendNull()
		if nullText {
			b.Field(1).AppendNull()
		} else {
			b.Field(1).(*array.StringBuilder).Append(fmt.Sprint("caption ", i))
		}
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	p := filepath.Join(t.TempDir(), "export.parquet")
	f, err := os.Create(p)
	must(t, err)
	defer f.Close()
	w, err := pqarrow.NewFileWriter(sc, f, nil, pqarrow.DefaultWriterProps())
	must(t, err)
	must(t, w.Write(rec))
	must(t, w.Close())
	return p
}

func pngBytes(t *testing.T) []byte {
	var b bytes.Buffer
	must(t, png.Encode(&b, image.NewNRGBA(image.Rect(0, 0, 24, 24))))
	return b.Bytes()
}

// TestAllQuarantinedExitsNonZero: when every sample is quarantined, shard,
// report and serve exit non-zero with the top reason, its count and its fix
// (they used to exit 0 having planned nothing); one good sample is enough to
// succeed.
func TestAllQuarantinedExitsNonZero(t *testing.T) {
	good := pngBytes(t)
	inputs := []struct {
		name, input string
		want        []string // in stderr; nil: exit 0
	}{
		{"missing files", writeManifest(t, nil, `{"image":"a.png","text":"a"}`, `{"image":"b.png","text":"b"}`),
			[]string{"all 2 samples were quarantined", "top reason missing_image: 2 samples", "set --root"}},
		{"null image column", writeHFParquet(t, 3, "text", false),
			[]string{"all 3 samples were quarantined", "top reason missing_image: 3 samples", "--image-field image.bytes"}},
		{"null captions", writeHFParquet(t, 2, "text", true),
			[]string{"top reason missing_caption: 2 samples", "--text-field caption"}},
		{"undecodable images", writeManifest(t, map[string][]byte{"a.png": []byte("not a png")}, `{"image":"a.png","text":"a"}`),
			[]string{"all 1 samples were quarantined", "top reason image_unsupported: 1 samples", "--image-field"}},
		{"one good sample", writeManifest(t, map[string][]byte{"a.png": good}, `{"image":"a.png","text":"a"}`, `{"image":"b.png","text":"b"}`), nil},
	}
	for _, in := range inputs {
		for _, cmd := range []string{"report", "shard", "serve"} {
			t.Run(in.name+"/"+cmd, func(t *testing.T) {
				args := []string{cmd, "--input", in.input, "--dp", "1", "--global-batch", "1", "--micro-batches", "1",
					"--image-size", "32"}
				switch cmd {
				case "shard":
					args = append(args, "--out", filepath.Join(t.TempDir(), "out"), "--feature-cache", "off")
				case "report":
					args = append(args, "--feature-cache", "off")
				case "serve":
					if in.want == nil {
						t.Skip("a good serve runs until its trainers finish")
					}
					args = append(args, "--job", "j", "--nats-listen", "", "--data-dir", t.TempDir(), "--no-wait")
				}
				var out, errb bytes.Buffer
				code := run(context.Background(), args, &out, &errb)
				if in.want == nil {
					if code != 0 {
						t.Fatalf("exit %d: %s", code, errb.String())
					}
					return
				}
				if code == 0 {
					t.Fatalf("exit 0, want non-zero; stdout %s", out.String())
				}
				for _, w := range in.want {
					if !strings.Contains(errb.String(), w) {
						t.Errorf("stderr lacks %q:\n%s", w, errb.String())
					}
				}
			})
		}
	}
}
