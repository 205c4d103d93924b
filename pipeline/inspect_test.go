package pipeline

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/mmfeed/mmfeed/tokenize"
)

// shardWith writes the shards of input with the given pixel dtype and returns the folder.
func shardWith(t *testing.T, input, dtype string) string {
	t.Helper()
	cfg := testConfig(input)
	cfg.Image.DType = dtype
	prep, err := Prepare(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prep.Close()
	plan, err := prep.Plan(balancer.StrategyMmfeed)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if _, err := WriteShards(context.Background(), prep, plan, out, nil); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReadRankStep: the pictures de-normalized from every wire dtype are the
// image the trainer gets (uint8 carries it exactly; the float encodings
// round-trip through mean/std within a level or two), and captions decode.
func TestReadRankStep(t *testing.T) {
	input := corpus(t, 120, "jsonl")
	tk, err := tokenize.Open(tokenize.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Close()
	ref, err := ReadRankStep(filepath.Join(shardWith(t, input, imgproc.DTypeUint8), RankFile(1)), 2, tk)
	if err != nil {
		t.Fatal(err)
	}
	for _, dtype := range []string{imgproc.DTypeFloat16, imgproc.DTypeFloat32, imgproc.DTypeBFloat16} {
		t.Run(dtype, func(t *testing.T) {
			got, err := ReadRankStep(filepath.Join(shardWith(t, input, dtype), RankFile(1)), 2, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(ref) {
				t.Fatalf("%d samples, uint8 shard has %d", len(got), len(ref))
			}
			tol := 1
			if dtype == imgproc.DTypeBFloat16 {
				tol = 4 // 8 bits of mantissa
			}
			for i := range got {
				if got[i].ID != ref[i].ID || got[i].Cost != ref[i].Cost || got[i].Caption != "" {
					t.Errorf("sample %d: %+v vs %+v", i, got[i].ID, ref[i].ID)
				}
				if d := maxDiff(got[i].Image.Pix, ref[i].Image.Pix); d > tol {
					t.Errorf("%s: pixels differ from the uint8 tensor by up to %d levels", got[i].ID, d)
				}
			}
		})
	}
	for _, s := range ref {
		if s.Weight > 0 && (s.Caption == "" || s.Image == nil || s.Image.Bounds().Dx() != 32) {
			t.Errorf("%s: caption %q image %v", s.ID, s.Caption, s.Image)
		}
	}
	if _, err := ReadRankStep(filepath.Join(shardWith(t, input, imgproc.DTypeUint8), RankFile(0)), 9999, nil); !errors.Is(err, ErrNoStep) {
		t.Errorf("missing step: %v, want ErrNoStep", err)
	}

	sheet := ContactSheet(ref, "title")
	if w := sheet.Bounds().Dx(); w != sheetGap+sheetCols*(sheetBox+sheetText+2*sheetGap) {
		t.Errorf("sheet width %d", w)
	}
	var page bytes.Buffer
	if err := WriteContactSheetHTML(&page, ref, "rank <1>"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rank &lt;1&gt;", `data-id="` + ref[0].ID + `"`, "data:image/png;base64,", ref[0].Caption[:5]} {
		if !strings.Contains(page.String(), want) {
			t.Errorf("sheet page lacks %q", want)
		}
	}
}

func maxDiff(a, b []uint8) int {
	if len(a) != len(b) {
		return 1 << 30
	}
	d := 0
	for i := range a {
		d = max(d, abs(int(a[i])-int(b[i])))
	}
	return d
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func TestWrap(t *testing.T) {
	tests := []struct {
		text string
		n    int
		want []string
	}{
		{"", 5, nil},
		{"a bb ccc", 4, []string{"a bb", "ccc"}},
		{"abcdefgh x", 3, []string{"abc", "def", "gh", "x"}},
		{"abcdefgh x", 4, []string{"abcd", "efgh", "x"}},
	}
	for _, tt := range tests {
		if got := wrap(tt.text, tt.n); strings.Join(got, "|") != strings.Join(tt.want, "|") {
			t.Errorf("wrap(%q, %d) = %q, want %q", tt.text, tt.n, got, tt.want)
		}
	}
}

// FuzzTensorImage: any tensor bytes and shape give a picture of that shape or
// an error, never a panic.
func FuzzTensorImage(f *testing.F) {
	f.Add(uint8(0), int32(3), int32(2), int32(2), make([]byte, 24))
	f.Add(uint8(3), int32(1), int32(4), int32(1), []byte{1, 2, 3, 4})
	dtypes := []string{proto.DTypeFloat16, proto.DTypeFloat32, proto.DTypeBFloat16, proto.DTypeUint8, "int4"}
	f.Fuzz(func(t *testing.T, d uint8, c, h, w int32, px []byte) {
		meta := proto.BatchMeta{DType: dtypes[int(d)%len(dtypes)], Mean: [3]float32{0.5, 0.5, 0.5}, Std: [3]float32{0.2, 0.2, 0.2}}
		img, err := TensorImage(meta, proto.Row{Pixels: px, PixelShape: [3]int32{c, h, w}})
		if err == nil && (img.Bounds().Dx() != int(w) || img.Bounds().Dy() != int(h)) {
			t.Errorf("shape %d×%d×%d gave %v", c, h, w, img.Bounds())
		}
	})
}
