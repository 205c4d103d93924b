package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/tokenize"
)

// prepareCounted runs Prepare and counts the entries the feature pass
// tokenized (Config.Progress): 0 when the features came from the cache.
func prepareCounted(t *testing.T, cfg Config) (*Prepared, int64, string) {
	t.Helper()
	var counted atomic.Int64
	cfg.Progress = func(done, _ int) {
		for {
			old := counted.Load()
			if int64(done) <= old || counted.CompareAndSwap(old, int64(done)) {
				return
			}
		}
	}
	var q bytes.Buffer
	prep, err := Prepare(context.Background(), cfg, &q)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prep.Close() })
	if prep.FeatureCacheErr != nil {
		t.Fatalf("feature cache: %v", prep.FeatureCacheErr)
	}
	return prep, counted.Load(), q.String()
}

// A second Prepare of the same dataset and settings reads the features from
// the cache (no feature pass) and gets the same features and quarantine; the
// cache entry is the whole index's, so another epoch's order hits it too.
func TestFeatureCacheSecondRunReadsIt(t *testing.T) {
	cfg := testConfig(corpus(t, 150, "jsonl"))
	cfg.FeatureCache = DirFeatureCache(t.TempDir())
	first, n1, q1 := prepareCounted(t, cfg)
	if first.FeaturesCached || n1 == 0 {
		t.Fatalf("first run: cached %v, %d entries tokenized", first.FeaturesCached, n1)
	}
	second, n2, q2 := prepareCounted(t, cfg)
	if !second.FeaturesCached || n2 != 0 || second.Fingerprint != first.Fingerprint {
		t.Fatalf("second run: cached %v, %d entries tokenized, fingerprint %s then %s",
			second.FeaturesCached, n2, first.Fingerprint, second.Fingerprint)
	}
	if !reflect.DeepEqual(first.Features, second.Features) {
		t.Error("the cached features differ from the computed ones")
	}
	if q1 == "" || !sameLines(q1, q2) {
		t.Errorf("quarantine differs: %q then %q", q1, q2)
	}
	nocache := cfg
	nocache.FeatureCache = nil
	plain, _, _ := prepareCounted(t, nocache)
	if !reflect.DeepEqual(plain.Features, first.Features) {
		t.Error("features through the cache differ from Prepare's without one")
	}
	epoch1 := cfg
	epoch1.Plan.Epoch = 1
	if p, n, _ := prepareCounted(t, epoch1); !p.FeaturesCached || n != 0 {
		t.Errorf("another epoch: cached %v, %d entries tokenized", p.FeaturesCached, n)
	}
}

func sameLines(a, b string) bool {
	count := map[string]int{}
	for _, l := range strings.Split(a, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(b, "\n") {
		count[l]--
	}
	for _, n := range count {
		if n != 0 {
			return false
		}
	}
	return true
}

// Whatever the features depend on changes the fingerprint, so a changed
// tokenizer, image config or dataset is not served stale features.
func TestFeatureCacheInvalidation(t *testing.T) {
	manifest := corpus(t, 60, "jsonl")
	tokPath, err := tokenize.DefaultTokenizerPath()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := os.ReadFile(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(t *testing.T, c *Config)
	}{
		{"max length", func(_ *testing.T, c *Config) { c.Tokenizer.MaxLength = 16 }},
		{"special tokens", func(_ *testing.T, c *Config) { c.Tokenizer.AddSpecialTokens = false }},
		{"tokenizer file", func(t *testing.T, c *Config) {
			p := filepath.Join(t.TempDir(), "tokenizer.json")
			if err := os.WriteFile(p, append(bytes.Clone(tok), '\n'), 0o644); err != nil {
				t.Fatal(err)
			}
			c.Tokenizer.Path = p
		}},
		{"image size", func(_ *testing.T, c *Config) { c.Image.Size = 48 }},
		{"resize policy", func(_ *testing.T, c *Config) { c.Image.Policy = "square" }},
		{"manifest touched", func(t *testing.T, c *Config) {
			later := time.Now().Add(time.Hour)
			if err := os.Chtimes(c.Input, later, later); err != nil {
				t.Fatal(err)
			}
		}},
		{"caption edited in place", func(t *testing.T, c *Config) {
			b, err := os.ReadFile(c.Input)
			if err != nil {
				t.Fatal(err)
			}
			i := bytes.Index(b, []byte(`"text":"`)) + len(`"text":"`)
			b[i] ^= 1 // same size, same mtime: only the index tells
			st, _ := os.Stat(c.Input)
			if err := os.WriteFile(c.Input, b, 0o644); err != nil {
				t.Fatal(err)
			}
			_ = os.Chtimes(c.Input, st.ModTime(), st.ModTime())
		}},
		{"image grown", func(t *testing.T, c *Config) {
			img := firstImage(t, c)
			st, _ := os.Stat(img)
			f, err := os.OpenFile(img, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.Write([]byte{0})
			f.Close()
			_ = os.Chtimes(img, st.ModTime(), st.ModTime()) // only the size tells
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := testConfig(copyCorpus(t, manifest, dir))
			cfg.FeatureCache = DirFeatureCache(filepath.Join(dir, "cache"))
			base, _, _ := prepareCounted(t, cfg)
			tc.edit(t, &cfg)
			p, n, _ := prepareCounted(t, cfg)
			if p.FeaturesCached || n == 0 || p.Fingerprint == base.Fingerprint {
				t.Errorf("after the change: cached %v, %d entries tokenized, fingerprint %s (was %s)",
					p.FeaturesCached, n, p.Fingerprint, base.Fingerprint)
			}
		})
	}
}

// copyCorpus copies a synthetic manifest corpus (manifest and images) into
// dir, keeping modification times, and returns the copy's manifest.
func copyCorpus(t *testing.T, manifest, dir string) string {
	t.Helper()
	src := filepath.Dir(manifest)
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		dst := filepath.Join(dir, "corpus", rel)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return err
		}
		st, _ := d.Info()
		return os.Chtimes(dst, st.ModTime(), st.ModTime())
	})
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "corpus", filepath.Base(manifest))
}

// firstImage is the image file the first line of c's manifest names.
func firstImage(t *testing.T, c *Config) string {
	t.Helper()
	b, err := os.ReadFile(c.Input)
	if err != nil {
		t.Fatal(err)
	}
	var line struct{ Image string }
	if err := json.Unmarshal(bytes.SplitN(b, []byte("\n"), 2)[0], &line); err != nil || line.Image == "" {
		t.Fatalf("first manifest line: %v", err)
	}
	return filepath.Join(filepath.Dir(c.Input), line.Image)
}

// A cache file that cannot be read makes Prepare compute the features
// (and say why), not fail.
func TestFeatureCacheUnreadableIsSkipped(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(corpus(t, 40, "jsonl"))
	cfg.FeatureCache = DirFeatureCache(dir)
	first, _, _ := prepareCounted(t, cfg)
	if err := os.WriteFile(DirFeatureCache(dir).path(first.Fingerprint), []byte("not gzip"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Prepare(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.FeaturesCached || p.FeatureCacheErr == nil || !reflect.DeepEqual(p.Features, first.Features) {
		t.Errorf("cached %v, cache error %v, same features %v", p.FeaturesCached, p.FeatureCacheErr, reflect.DeepEqual(p.Features, first.Features))
	}
	if again, n, _ := prepareCounted(t, cfg); !again.FeaturesCached || n != 0 { // rewritten
		t.Errorf("after the rewrite: cached %v, %d tokenized", again.FeaturesCached, n)
	}
}
