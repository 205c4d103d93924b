// Package hostile builds datasets holding every hostile input kind of the
// reliability issue (truncated, zero-byte, garbage, bombs, odd images, bad
// captions, malformed lines, paths out of the dataset, links out, FIFOs,
// duplicate ids, tar-slip names, cut tar members, Parquet of the wrong
// types), one dataset per source format, with the quarantine reason each
// sample must get. Only tests import it.
//
// Inputs: a testing.T and a format (jsonl, folder, wds, parquet). Outputs:
// the dataset path (in t.TempDir) and the cases. Ownership and concurrency:
// the files belong to the test; Dataset is safe to call from parallel tests.
package hostile

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"image"
	"image/jpeg"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/mmfeed/mmfeed/loader"
)

// The decode stage's reasons (pipeline.Reason*) are spelled out: pipeline's
// own tests import this package. TestShardHostileInputs fails when they drift.

// Case is one hostile sample: its id and the quarantine reason it must get
// ("" = delivered, it is valid input).
type Case struct {
	ID     string
	Reason string
	Loc    string // when set, the reject is found by its location's suffix (it has no id)
}

// Dataset writes a dataset of format holding good samples and one
// sample of every hostile kind that format can carry.
func Dataset(t *testing.T, format string) (string, []Case) {
	dir := t.TempDir()
	good := pngBytes(t, image.NewRGBA(image.Rect(0, 0, 40, 30)))
	kinds := sampleKinds(t, good)
	var want []Case
	for _, k := range kinds {
		want = append(want, Case{ID: k.id, Reason: k.reason})
	}
	switch format {
	case "jsonl":
		want = writeJSONL(t, dir, kinds, good, want)
	case "folder":
		want = writeFolder(t, dir, kinds, good, want)
	case "wds":
		want = writeWDS(t, dir, kinds, good, want)
	case "parquet":
		want = writeParquet(t, dir, kinds, want)
	}
	return dir, want
}

// kind is one sample every format carries: its caption, image bytes and the
// quarantine reason it must get.
type kind struct {
	id, text string
	img      []byte
	reason   string
}

// sampleKinds are the samples every format carries, good ones last.
func sampleKinds(t *testing.T, good []byte) []kind {
	kinds := []kind{
		{"truncated", "a truncated jpeg", jpegBytes(t)[:300], "image_corrupt"},
		{"zero-byte", "an empty file", nil, loader.ReasonEmptyImage},
		{"garbage", "random bytes", bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 64), "image_unsupported"},
		{"wrong-ext", "a png named jpg", good, ""},
		{"bomb", "a png that claims 50000x50000", pngBomb(50000, 50000), "image_too_large"},
		{"aspect", "1 x 100000", pngBytes(t, image.NewGray(image.Rect(0, 0, 1, 100000))), ""},
		{"gray16", "a 16-bit png", pngBytes(t, image.NewGray16(image.Rect(0, 0, 20, 20))), ""},
		{"cmyk", "a cmyk jpeg", cmykJPEG(t), ""},
		{"exif", "exif garbage", exifGarbage(t), ""},
		{"bad-utf8", "caf\xe9 au lait with one bad byte", good, ""},
		{"nul", "nul\x00inside", good, loader.ReasonBinaryCaption},
		{"huge-caption", strings.Repeat("long ", 2<<20/5+1), good, loader.ReasonTooLarge},
		{"rtl", "مرحبا بالعالم שלום עולם", good, ""},
		{"emoji", "🐈🐈‍⬛🌈✨", good, ""},
	}
	for i := range 12 {
		kinds = append(kinds, kind{fmt.Sprintf("good-%02d", i), fmt.Sprintf("a good caption number %d", i), good, ""})
	}
	return kinds
}

// writeJSONL writes a manifest dataset of kinds with the manifest's own
// hostile lines (malformed, missing fields, paths out, a link out, a FIFO,
// a duplicate id) and returns want with their cases.
func writeJSONL(t *testing.T, dir string, kinds []kind, good []byte, want []Case) []Case {
	var lines []string
	for _, k := range kinds {
		writeTestFile(t, filepath.Join(dir, "img", k.id+".jpg"), k.img)
		lines = append(lines, jsonLine(t, map[string]any{"id": k.id, "image": "img/" + k.id + ".jpg", "text": k.text}))
	}
	outside := filepath.Join(t.TempDir(), "secret.jpg")
	writeTestFile(t, outside, good)
	mustOK(t, os.Symlink(outside, filepath.Join(dir, "img", "link.jpg")))
	fifo(t, filepath.Join(dir, "img", "fifo.jpg"))
	lines = append(lines,
		`{"id": "malformed", "image": "img/good-00.jpg", "text": "x"`,
		`{"id": "no-image", "text": "x"}`,
		`{"id": "no-text", "image": "img/good-00.jpg"}`,
		jsonLine(t, map[string]any{"id": "dotdot", "image": "../secret.jpg", "text": "x"}),
		jsonLine(t, map[string]any{"id": "absolute", "image": outside, "text": "x"}),
		jsonLine(t, map[string]any{"id": "link-out", "image": "img/link.jpg", "text": "x"}),
		jsonLine(t, map[string]any{"id": "fifo", "image": "img/fifo.jpg", "text": "x"}),
		jsonLine(t, map[string]any{"id": "good-00", "image": "img/good-01.jpg", "text": "a duplicate id"}),
	)
	writeTestFile(t, filepath.Join(dir, "manifest.jsonl"), []byte(strings.Join(lines, "\n")))
	for i, k := range kinds {
		if k.id == "huge-caption" { // a line over the limit is not parsed: found by its line
			want[i].Loc = fmt.Sprintf("manifest.jsonl:%d", i+1)
		}
	}
	// the duplicate shares good-00's id: the accounting check counts it.
	return append(want, Case{ID: "no-image", Reason: loader.ReasonMissingImage},
		Case{ID: "no-text", Reason: loader.ReasonMissingCaption},
		Case{ID: "dotdot", Reason: loader.ReasonEscapesRoot}, Case{ID: "absolute", Reason: loader.ReasonEscapesRoot},
		Case{ID: "link-out", Reason: loader.ReasonEscapesRoot}, Case{ID: "fifo", Reason: loader.ReasonNotRegular},
		Case{ID: "malformed", Reason: loader.ReasonBadManifestLine, Loc: fmt.Sprintf("manifest.jsonl:%d", len(kinds)+1)})
}

// writeFolder writes an image folder of kinds with a caption linked out and
// a FIFO caption; ids are the image file names.
func writeFolder(t *testing.T, dir string, kinds []kind, good []byte, want []Case) []Case {
	for _, k := range kinds {
		writeTestFile(t, filepath.Join(dir, k.id+".jpg"), k.img)
		writeTestFile(t, filepath.Join(dir, k.id+".txt"), []byte(k.text))
	}
	secret := filepath.Join(t.TempDir(), "pw.txt")
	writeTestFile(t, secret, []byte("secret"))
	writeTestFile(t, filepath.Join(dir, "link-out.jpg"), good)
	mustOK(t, os.Symlink(secret, filepath.Join(dir, "link-out.txt")))
	writeTestFile(t, filepath.Join(dir, "fifo.jpg"), good)
	fifo(t, filepath.Join(dir, "fifo.txt"))
	want = append(want, Case{ID: "link-out.jpg", Reason: loader.ReasonEscapesRoot},
		Case{ID: "fifo.jpg", Reason: loader.ReasonNotRegular})
	for i := range want[:len(kinds)] {
		want[i].ID += ".jpg"
	}
	return want
}

// writeWDS writes a WebDataset shard of kinds with a tar-slip member, and a
// second shard whose last member is cut short.
func writeWDS(t *testing.T, dir string, kinds []kind, good []byte, want []Case) []Case {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, k := range kinds {
		tarMember(t, tw, k.id+".jpg", k.img)
		tarMember(t, tw, k.id+".txt", []byte(k.text))
	}
	tarMember(t, tw, "../../slip.jpg", good)
	tarMember(t, tw, "../../slip.txt", []byte("tar-slip"))
	mustOK(t, tw.Flush())
	data := buf.Bytes()
	var tail bytes.Buffer // a second shard whose last member is cut short
	tw2 := tar.NewWriter(&tail)
	tarMember(t, tw2, "cut.txt", []byte("truncated member"))
	tarMember(t, tw2, "cut.jpg", good)
	mustOK(t, tw2.Flush())
	writeTestFile(t, filepath.Join(dir, "a.tar"), data)
	writeTestFile(t, filepath.Join(dir, "b.tar"), tail.Bytes()[:3*512+len(good)/2]) // two headers, the caption, half the image
	return append(want, Case{ID: "../../slip", Reason: loader.ReasonEscapesRoot},
		Case{ID: "cut", Reason: loader.ReasonBrokenTar})
}

// writeParquet writes a Parquet file of kinds, a file that is not Parquet
// and one of the wrong column types.
func writeParquet(t *testing.T, dir string, kinds []kind, want []Case) []Case {
	var rows []pqRow
	for _, k := range kinds {
		rows = append(rows, pqRow{id: k.id, img: k.img, text: k.text})
	}
	writeHostileParquet(t, filepath.Join(dir, "a.parquet"), rows)
	writeTestFile(t, filepath.Join(dir, "b.parquet"), []byte("PAR1 not really parquet PAR1"))
	writeWrongTypes(t, filepath.Join(dir, "c.parquet"))
	return append(want, Case{ID: "not-parquet", Reason: loader.ReasonBadParquetFile, Loc: "b.parquet"},
		Case{ID: "wrong-types", Reason: loader.ReasonBadParquetFile, Loc: "c.parquet"})
}

func jsonLine(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	mustOK(t, err)
	return string(b)
}

func writeTestFile(t *testing.T, p string, data []byte) {
	t.Helper()
	mustOK(t, os.MkdirAll(filepath.Dir(p), 0o755))
	mustOK(t, os.WriteFile(p, data, 0o644))
}

func fifo(t *testing.T, p string) {
	t.Helper()
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func tarMember(t *testing.T, tw *tar.Writer, name string, data []byte) {
	t.Helper()
	mustOK(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}))
	_, err := tw.Write(data)
	mustOK(t, err)
}

func pngBytes(t *testing.T, img image.Image) []byte {
	var b bytes.Buffer
	mustOK(t, png.Encode(&b, img))
	return b.Bytes()
}

func jpegBytes(t *testing.T) []byte {
	img := image.NewRGBA(image.Rect(0, 0, 64, 64))
	for i := range img.Pix {
		img.Pix[i] = uint8(i * 7)
	}
	var b bytes.Buffer
	mustOK(t, jpeg.Encode(&b, img, nil))
	return b.Bytes()
}

// cmykJPEG encodes a CMYK image (image/jpeg writes it with an Adobe marker).
func cmykJPEG(t *testing.T) []byte {
	img := image.NewCMYK(image.Rect(0, 0, 24, 24))
	for i := range img.Pix {
		img.Pix[i] = uint8(i)
	}
	var b bytes.Buffer
	mustOK(t, jpeg.Encode(&b, img, nil))
	return b.Bytes()
}

// exifGarbage is a JPEG with an APP1 "Exif" segment of random bytes.
func exifGarbage(t *testing.T) []byte {
	j := jpegBytes(t)
	seg := append([]byte("Exif\x00\x00"), bytes.Repeat([]byte{0xff, 0x00, 0x2a, 0x13}, 40)...)
	app1 := []byte{0xff, 0xe1, byte((len(seg) + 2) >> 8), byte(len(seg) + 2)}
	return append(append(append([]byte{}, j[:2]...), append(app1, seg...)...), j[2:]...)
}

// pngBomb is a PNG whose header claims w×h pixels followed by a tiny,
// truncated IDAT: a decoder that trusts the header allocates w×h×4 bytes.
func pngBomb(w, h uint32) []byte {
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	chunk := func(kind string, data []byte) {
		binary.Write(&b, binary.BigEndian, uint32(len(data)))
		b.WriteString(kind)
		b.Write(data)
		binary.Write(&b, binary.BigEndian, crc32.ChecksumIEEE(append([]byte(kind), data...)))
	}
	ihdr := binary.BigEndian.AppendUint32(nil, w)
	ihdr = binary.BigEndian.AppendUint32(ihdr, h)
	chunk("IHDR", append(ihdr, 8, 6, 0, 0, 0))
	chunk("IDAT", []byte{0x78, 0x9c, 0x03, 0x00})
	chunk("IEND", nil)
	return b.Bytes()
}

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
