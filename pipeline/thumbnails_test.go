package pipeline

import (
	"bytes"
	"context"
	"image"
	"image/jpeg"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
)

// TestThumbnails checks the report's thumbnails: the heaviest samples first, in
// cost order, then the most extreme aspect ratios, each a decodable JPEG that
// fits ThumbnailSize with the sample's own aspect ratio; quarantine reasons
// come with example ids.
func TestThumbnails(t *testing.T) {
	prep, err := Prepare(context.Background(), testConfig(corpus(t, 200, "jsonl")), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prep.Close()
	plan, err := prep.Plan(balancer.StrategyMmfeed)
	if err != nil {
		t.Fatal(err)
	}
	th, err := Thumbnails(context.Background(), prep, plan, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(th) != 6 {
		t.Fatalf("%d thumbnails, want 6", len(th))
	}
	heavy := plan.Heaviest(3)
	ids := map[string]int32{}
	for i := range prep.Features.Len() {
		ids[prep.Features.Entry(i).ID] = int32(i)
	}
	for k, tn := range th {
		i := ids[tn.ID]
		wantKind := "heaviest"
		if k >= 3 {
			wantKind = "aspect"
		}
		if tn.Kind != wantKind || (k < 3 && heavy[k] != i) {
			t.Errorf("thumbnail %d: %s %s, want %s (heaviest %v)", k, tn.Kind, tn.ID, wantKind, heavy)
		}
		if tn.Cost != plan.ItemCost(i) || tn.TextTokens != prep.Features.Items[i].TextTokens {
			t.Errorf("%s: cost %g tokens %d, want %g %d", tn.ID, tn.Cost, tn.TextTokens, plan.ItemCost(i), prep.Features.Items[i].TextTokens)
		}
		img, err := jpeg.Decode(bytes.NewReader(tn.Image))
		if err != nil {
			t.Fatalf("%s: %v", tn.ID, err)
		}
		b, s := img.Bounds(), prep.Features.Sizes[i]
		if b.Dx() != tn.Width || b.Dy() != tn.Height || max(b.Dx(), b.Dy()) > ThumbnailSize {
			t.Errorf("%s: %v, recorded %dx%d", tn.ID, b, tn.Width, tn.Height)
		}
		if got, want := float64(b.Dx())/float64(b.Dy()), float64(s.X)/float64(s.Y); got/want > 1.1 || want/got > 1.1 {
			t.Errorf("%s: aspect %.3f, the image's %.3f", tn.ID, got, want)
		}
	}
	for k := 4; k < 6; k++ {
		if aspectOf(prep.Features.Sizes[ids[th[k].ID]]) > aspectOf(prep.Features.Sizes[ids[th[k-1].ID]]) {
			t.Errorf("aspect thumbnails not most extreme first")
		}
	}
	reasons := QuarantineReasons(prep.Quarantine)
	var total int64
	for r, g := range reasons {
		total += g.Count
		if len(g.Examples) == 0 || int64(len(g.Examples)) > min(g.Count, 3) {
			t.Errorf("%s: %d examples of %d", r, len(g.Examples), g.Count)
		}
	}
	if total == 0 || total != prep.Quarantine.Total() {
		t.Errorf("reasons sum to %d, quarantine holds %d", total, prep.Quarantine.Total())
	}
}

func TestThumbnailJPEGRejects(t *testing.T) {
	var big bytes.Buffer
	_ = jpeg.Encode(&big, image.NewGray(image.Rect(0, 0, 300, 200)), nil)
	tests := []struct {
		name string
		data []byte
		max  int
		ok   bool
	}{
		{"fits", big.Bytes(), 1 << 20, true},
		{"over the pixel limit", big.Bytes(), 300*200 - 1, false},
		{"not an image", []byte("hello"), 0, false},
		{"truncated", big.Bytes()[:len(big.Bytes())/2], 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, w, h, err := ThumbnailJPEG(tt.data, tt.max)
			if (err == nil) != tt.ok {
				t.Fatalf("err %v, want ok %v", err, tt.ok)
			}
			if tt.ok && (w != ThumbnailSize || h != ThumbnailSize*2/3) {
				t.Errorf("%dx%d", w, h)
			}
		})
	}
}

// FuzzThumbnailJPEG: any file bytes give a thumbnail or an error, never a panic
// or an oversized picture.
func FuzzThumbnailJPEG(f *testing.F) {
	var seed bytes.Buffer
	_ = jpeg.Encode(&seed, image.NewGray(image.Rect(0, 0, 40, 9)), nil)
	f.Add(seed.Bytes())
	f.Add([]byte("\x89PNG\r\n\x1a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		jpg, w, h, err := ThumbnailJPEG(data, 1<<22)
		if err == nil && (len(jpg) == 0 || w > ThumbnailSize || h > ThumbnailSize || w < 1 || h < 1) {
			t.Errorf("thumbnail %dx%d, %d bytes", w, h, len(jpg))
		}
	})
}
