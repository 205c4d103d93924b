package imgproc

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestFastDecodePSNR measures what DecodeFast costs in quality: the PSNR of its tensors
// against DecodeExact's, on every JPEG of the real corpus (skipped without one), for
// Pillow's draft rule (gap 1, the default) and gap 2. docs/imgproc.md quotes the log.
// In the pure-Go build both modes decode at full size and must agree exactly.
func TestFastDecodePSNR(t *testing.T) {
	if testing.Short() {
		t.Skip("decodes the corpus JPEGs")
	}
	var paths []string
	for _, p := range corpusImages(t) {
		if strings.EqualFold(filepath.Ext(p), ".jpg") || strings.EqualFold(filepath.Ext(p), ".jpeg") {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		t.Skip("no corpus JPEGs")
	}
	exact := DefaultConfig()
	exact.DType = DTypeFloat32
	pe, err := NewProcessor(exact)
	if err != nil {
		t.Fatal(err)
	}
	for _, gap := range []float64{1, 2} {
		t.Run(fmt.Sprintf("gap=%g", gap), func(t *testing.T) {
			fast := exact
			fast.Decode, fast.JPEGDraftGap = DecodeFast, gap
			pf, err := NewProcessor(fast)
			if err != nil {
				t.Fatal(err)
			}
			var all, drafted []float64
			for _, p := range paths {
				data, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				a, errA := pe.Process(data)
				b, errB := pf.Process(data)
				if (errA == nil) != (errB == nil) {
					t.Fatalf("%s: exact err %v, fast err %v", p, errA, errB)
				}
				if errA != nil {
					continue
				}
				if a.Shape != b.Shape {
					t.Fatalf("%s: shape exact %v, fast %v", p, a.Shape, b.Shape)
				}
				db := psnr(f32s(a.Data), f32s(b.Data), a.Mean, a.Std)
				all = append(all, db)
				if !math.IsInf(db, 1) {
					drafted = append(drafted, db)
				}
			}
			slices.Sort(all)
			t.Logf("%d corpus JPEGs, gap %g: %d decoded smaller; PSNR vs exact min %.2f dB, median %.2f dB (all), median %.2f dB (drafted only)",
				len(all), gap, len(drafted), all[0], all[len(all)/2], medianOr(drafted))
			if !haveTurbo && len(drafted) > 0 {
				t.Errorf("pure-Go build: %d images differ between exact and fast", len(drafted))
			}
			if all[0] < 30 {
				t.Errorf("min PSNR %.2f dB, want >= 30", all[0])
			}
		})
	}
}

func f32s(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func medianOr(v []float64) float64 {
	if len(v) == 0 {
		return math.Inf(1)
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
