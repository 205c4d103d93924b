package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"image/jpeg"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/imgproc"
)

// sourceFiles maps the ids of a synth JSONL corpus to their image bytes.
func sourceFiles(t *testing.T, manifest string) map[string][]byte {
	t.Helper()
	f, err := os.Open(manifest)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l struct{ ID, Image string }
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(filepath.Dir(manifest), l.Image)); err == nil {
			out[l.ID] = b
		}
	}
	return out
}

// decodeJPEGRow decodes a JPEG row to uint8 CHW with Go's decoder.
func decodeJPEGRow(t *testing.T, b []byte) (pix []byte, h, w int) {
	t.Helper()
	m, err := jpeg.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("row is not a JPEG: %v", err)
	}
	r := m.Bounds()
	h, w = r.Dy(), r.Dx()
	pix = make([]byte, 3*h*w)
	for y := range h {
		for x := range w {
			c, g, bl, _ := m.At(r.Min.X+x, r.Min.Y+y).RGBA()
			pix[y*w+x], pix[h*w+y*w+x], pix[2*h*w+y*w+x] = uint8(c>>8), uint8(g>>8), uint8(bl>>8)
		}
	}
	return pix, h, w
}

func psnrBytes(a, b []byte) float64 {
	var se float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		se += d * d
	}
	if se == 0 {
		return math.Inf(1)
	}
	return 10 * math.Log10(255*255/(se/float64(len(a))))
}

// TestServeJPEGWire serves the jpeg wire dtypes (in-process and through the
// planner's workers) and compares every delivered row with the exact uint8
// path of the same plan: same ids, tokens and shapes; a re-encoded image
// decodes to the planned shape within a PSNR floor; under jpeg-source an
// acceptable source JPEG arrives byte for byte and everything else (the
// corpus's PNGs, the failed samples' placeholders) as a re-encoded JPEG.
func TestServeJPEGWire(t *testing.T) {
	const floor = 30.0 // dB, q95 JPEG of the synth corpus (noise images included) against the exact tensor
	input := corpus(t, 48)
	files := sourceFiles(t, input)
	for _, tc := range []struct {
		name, dtype, role string
	}{
		{"jpeg", imgproc.DTypeJPEG, RoleAll},
		{"jpeg-source", imgproc.DTypeJPEGSource, RoleAll},
		{"jpeg-source workers", imgproc.DTypeJPEGSource, RolePlanner},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, input, 2, 1, "colocated")
			cfg.Recalibrate, cfg.Role, cfg.QuarantineDir = -1, tc.role, t.TempDir()
			if tc.role == RolePlanner {
				cfg.LocalWorkers = 1
			}
			exactCfg := cfg
			exactCfg.Pipeline.Image.DType = imgproc.DTypeUint8
			ex := shardExpectation(t, exactCfg, 0)
			cfg.Pipeline.Image.DType = tc.dtype
			r := start(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			trs := runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0})
			var passed, encoded int
			for _, tr := range trs {
				for k, got := range tr.applied {
					want := ex.rows[[3]int{k.Step, k.DPRank, k.MicroBatch}]
					if len(got) != len(want) {
						t.Fatalf("%v: %d rows, exact path %d", k, len(got), len(want))
					}
					for i, g := range got {
						w := want[i]
						if g.ID != w.ID || g.PixelShape != w.PixelShape || g.Weight != w.Weight || len(g.InputIDs) != len(w.InputIDs) {
							t.Fatalf("%v row %d: %s %v weight %v, exact path %s %v weight %v", k, i, g.ID, g.PixelShape, g.Weight, w.ID, w.PixelShape, w.Weight)
						}
						if tc.dtype == imgproc.DTypeJPEGSource && g.Weight > 0 && bytes.Equal(g.Pixels, files[g.ID]) {
							passed++
							continue
						}
						pix, h, wd := decodeJPEGRow(t, g.Pixels)
						if h != int(w.PixelShape[1]) || wd != int(w.PixelShape[2]) {
							t.Fatalf("%v row %d (%s): decodes to %d×%d, planned %v", k, i, g.ID, h, wd, w.PixelShape)
						}
						if p := psnrBytes(pix, w.Pixels); p < floor {
							t.Errorf("%v row %d (%s): PSNR %.1f dB against the exact path, want >= %.0f", k, i, g.ID, p, floor)
						}
						encoded++
					}
				}
			}
			if encoded == 0 || tc.dtype == imgproc.DTypeJPEGSource && passed == 0 {
				t.Fatalf("%d rows passed through, %d re-encoded: the corpus does not exercise the mode", passed, encoded)
			}
			t.Logf("%s: %d source JPEGs passed through, %d re-encoded", tc.dtype, passed, encoded)
		})
	}
}
