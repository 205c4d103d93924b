package imgproc

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mmfeed/mmfeed/internal/testpeer"
)

func runPeer(t testing.TB, py string, args ...string) {
	t.Helper()
	cmd := exec.Command(py, append([]string{filepath.Join("..", "scripts", "pillow_peer.py")}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pillow_peer %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// peerResult is one line of the peer's results.jsonl.
type peerResult struct {
	I     int    `json:"i"`
	Path  string `json:"path"`
	OK    bool   `json:"ok"`
	Shape []int  `json:"shape"`
	Src   []int  `json:"src"`
	Error string `json:"error"`
}

// peerProcess runs the peer on paths with cfg's geometry and normalization
// and returns its results and output directory.
func peerProcess(t testing.TB, py string, paths []string, cfg Config) ([]peerResult, string) {
	t.Helper()
	dir := t.TempDir()
	list := filepath.Join(dir, "list.txt")
	if err := os.WriteFile(list, []byte(strings.Join(paths, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	args := []string{"process", "--list", list, "--out", out, "--policy", cfg.Policy,
		"--size", fmt.Sprint(cfg.Size), "--patch", fmt.Sprint(cfg.PatchSize),
		"--min-pixels", fmt.Sprint(cfg.MinPixels), "--max-pixels", fmt.Sprint(cfg.MaxPixels),
		"--filter", cfg.Filter, "--norm", cfg.Norm, "--draft-gap", fmt.Sprint(cfg.draftGap())}
	runPeer(t, py, args...)
	f, err := os.Open(filepath.Join(out, "results.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var res []peerResult
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r peerResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		res = append(res, r)
	}
	if len(res) != len(paths) {
		t.Fatalf("peer returned %d results, want %d", len(res), len(paths))
	}
	return res, out
}

func readF32(t testing.TB, path string) []float32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// psnr compares two normalized CHW float32 tensors in 0..1 pixel space
// (x*std+mean). Identical tensors give +Inf.
func psnr(a, b []float32, mean, std [3]float32) float64 {
	plane := len(a) / 3
	var se float64
	for i := range a {
		c := i / plane
		d := float64(a[i]*std[c]) - float64(b[i]*std[c])
		se += d * d
	}
	mse := se / float64(len(a))
	if mse == 0 {
		return math.Inf(1)
	}
	return 10 * math.Log10(1/mse)
}

type parityRow struct {
	path string
	psnr float64
}

// checkParity processes paths in Go and with the peer and enforces the PSNR
// thresholds; both must agree on which files fail to decode.
func checkParity(t *testing.T, py string, paths []string, cfg Config, wantMedian, wantMin float64) {
	t.Helper()
	cfg.DType = DTypeFloat32
	p, err := NewProcessor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, out := peerProcess(t, py, paths, cfg)
	mean, std := cfg.MeanStd()
	var rows []parityRow
	for i, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		img, gerr := p.Process(data)
		r := res[i]
		switch {
		case gerr != nil && !r.OK:
			continue // both reject: fine
		case gerr != nil:
			t.Errorf("%s: Go error %v, Pillow decoded it", path, gerr)
			continue
		case !r.OK:
			t.Logf("%s: Pillow error %s, Go decoded it (not counted)", path, r.Error)
			continue
		}
		if got, want := img.Shape[:], r.Shape; !slices.Equal(got, want) {
			t.Errorf("%s: shape got %v, want %v", path, got, want)
			continue
		}
		if got, want := []int{img.SrcWidth, img.SrcHeight}, r.Src; !slices.Equal(got, want) {
			t.Errorf("%s: src size got %v, want %v", path, got, want)
		}
		gv := make([]float32, len(img.Data)/4)
		for j := range gv {
			gv[j] = math.Float32frombits(binary.LittleEndian.Uint32(img.Data[4*j:]))
		}
		pv := readF32(t, filepath.Join(out, fmt.Sprintf("%d.f32", i)))
		row := parityRow{path, psnr(gv, pv, mean, std)}
		// Every decoder reproduces Pillow exactly, as does the resampler,
		// except Go's JPEG decoder (its IDCT differs from libjpeg's), which
		// the pure-Go build uses for every JPEG and the libjpeg-turbo build
		// for CMYK/YCCK ones (32 bits per pixel): any other difference is a
		// regression, in DecodeExact and in DecodeFast (Pillow drafts with
		// the same rule).
		if h, _ := ReadHeader(data); !goJPEG(h) && !math.IsInf(row.psnr, 1) {
			t.Errorf("%s: %.2f dB, want bit-exact for %s (%d bpp)", path, row.psnr, h.Format, h.BitsPerPixel)
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		t.Fatal("no image compared")
	}
	slices.SortFunc(rows, func(a, b parityRow) int { return compareF(a.psnr, b.psnr) })
	med := rows[len(rows)/2].psnr
	exact := 0
	for _, r := range rows {
		if math.IsInf(r.psnr, 1) {
			exact++
		}
	}
	t.Logf("%d images: min %.2f dB, median %.2f dB, %d bit-exact", len(rows), rows[0].psnr, med, exact)
	for _, r := range rows[:min(8, len(rows))] {
		t.Logf("  lowest: %.2f dB %s", r.psnr, filepath.Base(r.path))
	}
	writeParityReport(t, rows)
	if med < wantMedian {
		t.Errorf("median PSNR got %.2f dB, want >= %.1f", med, wantMedian)
	}
	if rows[0].psnr < wantMin {
		t.Errorf("min PSNR got %.2f dB (%s), want >= %.1f", rows[0].psnr, rows[0].path, wantMin)
	}
}

// goJPEG reports whether Go's own JPEG decoder handles the image.
func goJPEG(h Header) bool {
	return h.Format == FormatJPEG && (!haveTurbo || h.BitsPerPixel == 32)
}

func compareF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// writeParityReport appends per-image PSNR to $MMFEED_PARITY_REPORT.
func writeParityReport(t *testing.T, rows []parityRow) {
	path := os.Getenv("MMFEED_PARITY_REPORT")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, r := range rows {
		fmt.Fprintf(f, "%s\t%s\t%.3f\n", t.Name(), r.path, r.psnr)
	}
}

// generatedFixtures writes ≥200 varied images with the peer's generator
// (once per test binary run).
func generatedFixtures(t *testing.T, py string) []string {
	t.Helper()
	dir := t.TempDir()
	runPeer(t, py, "gen", dir, "--n", "224", "--seed", "1")
	var paths []string
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".jsonl") {
			paths = append(paths, filepath.Join(dir, e.Name()))
		}
	}
	if len(paths) < 200 {
		t.Fatalf("generated %d fixtures, want >= 200", len(paths))
	}
	return paths
}

func TestPillowParity(t *testing.T) {
	if testing.Short() {
		t.Skip("shells out to the Pillow peer")
	}
	py := testpeer.Python(t)
	paths := generatedFixtures(t, py)
	base := DefaultConfig() // DecodeExact
	cases := []struct {
		name   string
		mod    func(*Config)
		median float64
		min    float64
	}{
		{"shorter-crop/bilinear", func(*Config) {}, 40, 30},
		{"shorter-crop/bicubic", func(c *Config) { c.Filter = FilterBicubic }, 40, 30},
		{"square/bilinear/clip", func(c *Config) { c.Policy = PolicySquare; c.Size = 256; c.Norm = NormCLIP }, 40, 30},
		{"dynamic/bilinear", func(c *Config) { c.Policy = PolicyDynamic; c.MaxPixels = 448 * 448 }, 40, 30},
	}
	if haveTurbo {
		cases = append(cases, struct {
			name   string
			mod    func(*Config)
			median float64
			min    float64
		}{"shorter-crop/bilinear/fast", func(c *Config) { c.Decode = DecodeFast }, 40, 30},
			struct {
				name   string
				mod    func(*Config)
				median float64
				min    float64
			}{"shorter-crop/bilinear/fast-gap2", func(c *Config) { c.Decode = DecodeFast; c.JPEGDraftGap = 2 }, 40, 30})
	}
	for _, tc := range cases {
		t.Run("generated/"+tc.name, func(t *testing.T) {
			cfg := base
			tc.mod(&cfg)
			checkParity(t, py, paths, cfg, tc.median, tc.min)
		})
	}
	t.Run("corpus/shorter-crop/bilinear", func(t *testing.T) {
		paths := corpusImages(t)
		checkParity(t, py, paths, base, 40, 30)
	})
}

// corpusImages lists up to $MMFEED_CORPUS_LIMIT (default 400) images of the
// real corpus ($MMFEED_CORPUS or /tmp/corpus, dev/images), evenly spaced in
// sorted order; skips when there is none.
func corpusImages(t *testing.T) []string {
	t.Helper()
	root := os.Getenv("MMFEED_CORPUS")
	if root == "" {
		root = "/tmp/corpus"
	}
	dir := filepath.Join(root, "dev", "images")
	var all []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			all = append(all, p)
		}
		return nil
	})
	if len(all) == 0 {
		t.Skipf("no corpus images under %s", dir)
	}
	slices.Sort(all)
	limit := 400
	if v := os.Getenv("MMFEED_CORPUS_LIMIT"); v != "" {
		fmt.Sscan(v, &limit)
	}
	if limit <= 0 || limit >= len(all) {
		return all
	}
	picked := make([]string, 0, limit)
	for i := range limit {
		picked = append(picked, all[i*len(all)/limit])
	}
	return picked
}
