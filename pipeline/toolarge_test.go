package pipeline

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

	"github.com/mmfeed/mmfeed/loader"
)

// TestTooLargeDetailsGiveSizeAndLimit: an image refused as too large says how
// large it is and what the limit is, for the file-size and the pixel limit of
// the feature pass and for thumbnails.
func TestTooLargeDetailsGiveSizeAndLimit(t *testing.T) {
	img := image.NewNRGBA(image.Rect(0, 0, 64, 48))
	for i := range img.Pix {
		img.Pix[i] = byte(i * 31)
	}
	var b bytes.Buffer
	mustOK(t, png.Encode(&b, img))
	dir := t.TempDir()
	mustOK(t, os.WriteFile(filepath.Join(dir, "big.png"), b.Bytes(), 0o644))
	var lines bytes.Buffer
	for i := range 8 {
		fmt.Fprintf(&lines, `{"image":"big.png","text":"caption %d"}`+"\n", i)
	}
	manifest := filepath.Join(dir, "manifest.jsonl")
	mustOK(t, os.WriteFile(manifest, lines.Bytes(), 0o644))
	size := b.Len()
	for _, c := range []struct {
		name   string
		bytes  int
		pixels int
		want   []string
	}{
		{"file bytes", size - 1, 1 << 20, []string{fmt.Sprintf("%d bytes > limit %d", size, size-1)}},
		{"pixels", 1 << 20, 1000, []string{"64x48", "3072 pixels > limit 1000"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(manifest)
			cfg.Plan.DP, cfg.Plan.MicroBatches, cfg.Plan.GlobalBatch = 1, 1, 1
			cfg.Image.MaxFileBytes, cfg.Image.MaxImagePixels = c.bytes, c.pixels
			var q bytes.Buffer
			prep, err := Prepare(context.Background(), cfg, &q)
			if err == nil {
				prep.Close()
			}
			rejects, _ := loader.ReadQuarantine(&q)
			if len(rejects) == 0 {
				t.Fatalf("nothing quarantined (Prepare: %v)", err)
			}
			for _, r := range rejects {
				for _, w := range c.want {
					if r.Reason != ReasonImageTooLarge || !strings.Contains(r.Detail, w) {
						t.Errorf("reject %s %q, want %s naming %q", r.Reason, r.Detail, ReasonImageTooLarge, w)
					}
				}
			}
		})
	}
	if _, _, _, err := ThumbnailJPEG(b.Bytes(), 1000); err == nil || !strings.Contains(err.Error(), "64x48 = 3072 pixels > limit 1000") {
		t.Errorf("thumbnail: got %v, want the dimensions and the limit", err)
	}
}
