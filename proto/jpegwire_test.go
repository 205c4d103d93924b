package proto

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/memory"
)

// TestJPEGSourceMatchesTrainer fails when the jpeg-source names and limits
// drift from trainer/mmfeed_trainer/schema_keys.json, which the trainer reads.
func TestJPEGSourceMatchesTrainer(t *testing.T) {
	raw, err := os.ReadFile("../trainer/mmfeed_trainer/schema_keys.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		JPEGSource struct {
			DType     string `json:"dtype"`
			ResizeKey string `json:"resize_key"`
			MaxBytes  int    `json:"max_bytes"`
			MaxPixels int    `json:"max_pixels"`
		} `json:"jpeg_source"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	j := doc.JPEGSource
	if j.DType != DTypeJPEGSource || j.ResizeKey != FieldResize || j.MaxBytes != MaxSourceJPEGBytes || j.MaxPixels != MaxSourceJPEGPixels {
		t.Errorf("schema_keys.json jpeg_source = %+v, proto has dtype %q key %q bytes %d pixels %d",
			j, DTypeJPEGSource, FieldResize, MaxSourceJPEGBytes, MaxSourceJPEGPixels)
	}
}

// jpegRows returns n rows whose pixels are the given byte strings (not
// decoded here: proto only bounds their size).
func jpegRows(meta BatchMeta, pix ...[]byte) []Row {
	rows := testRows(testMeta(meta.Modality, DTypeUint8, meta.Shape), len(pix))
	for i := range rows {
		rows[i].Pixels = pix[i]
	}
	return rows
}

// TestJPEGSourceRecord: a jpeg-source record round-trips through IPC with
// its resize metadata and its rows' bytes unchanged; the resize and the row
// size limits are checked on both sides.
func TestJPEGSourceRecord(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	meta := testMeta(ModalityAll, DTypeJPEGSource, []int{3, 4, 4})
	meta.Resize = "shorter-crop/bilinear"
	big := bytes.Repeat([]byte{0xff}, 5000) // larger than a jpeg row of 3×4×4 may be, fine for a source
	rows := jpegRows(meta, []byte{0xff, 0xd8, 0xff}, big)
	rec, err := BuildRecord(mem, meta, rows)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := EncodeIPC(rec)
	rec.Release()
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeIPC(mem, payload)
	if err != nil {
		t.Fatal(err)
	}
	defer back.Release()
	got, gotRows, err := ReadRows(back)
	if err != nil {
		t.Fatal(err)
	}
	if got.DType != DTypeJPEGSource || got.Resize != meta.Resize {
		t.Errorf("read dtype %q resize %q, want %q %q", got.DType, got.Resize, DTypeJPEGSource, meta.Resize)
	}
	for i := range rows {
		if !bytes.Equal(gotRows[i].Pixels, rows[i].Pixels) {
			t.Errorf("row %d: pixels changed on the way", i)
		}
	}
	for _, tc := range []struct {
		name   string
		dtype  string
		resize string
		pix    []byte
		want   error
	}{
		{"source row over the cap", DTypeJPEGSource, "square/bicubic", make([]byte, MaxSourceJPEGBytes+1), ErrInvalidRow},
		{"empty source row", DTypeJPEGSource, "dynamic/bilinear", []byte{}, ErrInvalidRow},
		{"jpeg row over its shape's cap", DTypeJPEG, "", big, ErrInvalidRow},
		{"no resize", DTypeJPEGSource, "", []byte{1}, ErrInvalidMeta},
		{"unknown policy", DTypeJPEGSource, "crop/bilinear", []byte{1}, ErrInvalidMeta},
		{"unknown filter", DTypeJPEGSource, "square/lanczos", []byte{1}, ErrInvalidMeta},
		{"resize on another dtype", DTypeJPEG, "square/bilinear", []byte{1}, ErrInvalidMeta},
	} {
		m := meta
		m.DType, m.Resize = tc.dtype, tc.resize
		rec, err := BuildRecord(mem, m, jpegRows(m, tc.pix))
		if err == nil {
			rec.Release()
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
}
