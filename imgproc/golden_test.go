package imgproc

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata")

type goldenEntry struct {
	Shape      [3]int  `json:"shape"`
	SHA256     string  `json:"sha256"`
	Complexity float64 `json:"complexity"`
}

// TestGolden pins the default pipeline's float16 output for every seed
// image. The pure-Go and libjpeg-turbo builds decode JPEG differently (IDCT
// rounding), so each has its own golden file. Refresh with -update after an
// intended change, and check the Pillow parity test still passes.
func TestGolden(t *testing.T) {
	name := "golden_pure.json"
	if haveTurbo {
		name = "golden_turbo.json"
	}
	path := filepath.Join("testdata", name)
	cfg := DefaultConfig() // DecodeExact
	p, err := NewProcessor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]goldenEntry{}
	imgs := encoded(t)
	names := make([]string, 0, len(imgs))
	for n := range imgs {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		img, err := p.Process(imgs[n])
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		sum := sha256.Sum256(img.Data)
		got[n] = goldenEntry{img.Shape, hex.EncodeToString(sum[:]), float64(int64(img.Complexity*1e6)) / 1e6}
	}
	if *update {
		b, _ := json.MarshalIndent(got, "", "  ")
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run TestGolden -update)", err)
	}
	var want map[string]goldenEntry
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if got[n] != want[n] {
			t.Errorf("%s: got %+v, want %+v", n, got[n], want[n])
		}
	}
}
