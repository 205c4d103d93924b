package synth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"image"
	_ "image/jpeg"
	_ "image/png"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// treeHash hashes every file under dir (names and contents).
func treeHash(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	var names []string
	must(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			names = append(names, p)
		}
		return err
	}))
	sort.Strings(names)
	for _, p := range names {
		data, err := os.ReadFile(p)
		must(t, err)
		rel, _ := filepath.Rel(dir, p)
		h.Write([]byte(rel))
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestGenerateDeterministic(t *testing.T) {
	for _, format := range []string{FormatJSONL, FormatWDS} {
		t.Run(format, func(t *testing.T) {
			gen := func(seed uint64, workers int) string {
				out := t.TempDir()
				_, err := Generate(context.Background(), Config{Out: out, Samples: 50, Seed: seed,
					Format: format, ShardSize: 20, BadFraction: 0.1, Workers: workers, MaxSide: 256})
				must(t, err)
				return treeHash(t, out)
			}
			a, b, c := gen(1, 1), gen(1, 3), gen(2, 2)
			if a != b {
				t.Errorf("same seed, different worker counts: hashes %s vs %s", a, b)
			}
			if a == c {
				t.Errorf("seeds 1 and 2 gave identical corpora")
			}
		})
	}
}

func TestGenerateSkew(t *testing.T) {
	tests := []struct {
		skew       string
		wantVaried bool
	}{{SkewStrong, true}, {SkewNone, false}}
	for _, tt := range tests {
		t.Run(tt.skew, func(t *testing.T) {
			out := t.TempDir()
			sum, err := Generate(context.Background(), Config{Out: out, Samples: 120, Seed: 3, Skew: tt.skew})
			must(t, err)
			sizes, words := map[image.Point]bool{}, map[int]bool{}
			data, err := os.ReadFile(sum.Path)
			must(t, err)
			for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
				img := line[strings.Index(line, `"image":"`)+9:]
				img = img[:strings.IndexByte(img, '"')]
				f, err := os.Open(filepath.Join(out, img))
				must(t, err)
				cfg, _, err := image.DecodeConfig(f)
				f.Close()
				must(t, err)
				sizes[image.Pt(cfg.Width, cfg.Height)] = true
				text := line[strings.Index(line, `"text":"`)+8:]
				words[len(strings.Fields(text))] = true
			}
			if varied := len(sizes) > 10 && len(words) > 10; varied != tt.wantVaried {
				t.Errorf("got %d sizes and %d caption lengths, want varied=%v", len(sizes), len(words), tt.wantVaried)
			}
			if tt.skew == SkewStrong && (sum.PNG == 0 || sum.JPEG == 0 || sum.MaxWords < 40) {
				t.Errorf("strong skew summary lacks variety: %+v", sum)
			}
		})
	}
}

func TestGenerateBadSamples(t *testing.T) {
	out := t.TempDir()
	sum, err := Generate(context.Background(), Config{Out: out, Samples: 200, Seed: 5, BadFraction: 0.5})
	must(t, err)
	if len(sum.BadByKind) != len(badKinds) {
		t.Errorf("bad kinds: got %v, want all of %v", sum.BadByKind, badKinds)
	}
	for _, b := range sum.Bad {
		st, err := os.Stat(filepath.Join(out, "images", b.ID+".jpg"))
		if err != nil {
			st, err = os.Stat(filepath.Join(out, "images", b.ID+".png"))
		}
		switch b.Kind {
		case BadMissingFile:
			if !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s: missing_file exists", b.ID)
			}
		case BadZeroByte:
			if err != nil || st.Size() != 0 {
				t.Errorf("%s: zero_byte: %v", b.ID, err)
			}
		}
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{Out: "x"}, true},
		{"no out", Config{}, false},
		{"bad format", Config{Out: "x", Format: "zip"}, false},
		{"bad skew", Config{Out: "x", Skew: "mild"}, false},
		{"bad fraction", Config{Out: "x", BadFraction: 0.9}, false},
		{"sides", Config{Out: "x", MinSide: 100, MaxSide: 50}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if (err == nil) != tt.ok || err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("Validate: got %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func BenchmarkGenerate(b *testing.B) {
	for _, skew := range []string{SkewStrong, SkewNone} {
		b.Run("skew="+skew+"/samples=200", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Generate(context.Background(), Config{Out: b.TempDir(), Samples: 200, Skew: skew}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestProgress(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Out, cfg.Samples = t.TempDir(), 20
	var calls []int
	cfg.Progress = func(done, total int) {
		if total != 20 {
			t.Errorf("total %d, want 20", total)
		}
		calls = append(calls, done)
	}
	if _, err := Generate(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 20 || calls[0] != 1 || calls[19] != 20 {
		t.Errorf("progress calls %v, want 1..20", calls)
	}
}
