package loader

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func mix3(draws int, caps ...int) *Mixture {
	m := &Mixture{Draws: draws, Sources: []MixtureSource{
		{Name: "web", Path: "w", Weight: 6}, {Name: "coco", Path: "c", Weight: 3}, {Name: "own", Path: "o", Weight: 1}}}
	for i, c := range caps {
		m.Sources[i].Cap = c
	}
	return m
}

func TestMixtureCounts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		m     *Mixture
		sizes []int
		want  []int
	}{
		{"heaviest once through", mix3(0), []int{6000, 5000, 50}, []int{6000, 3000, 1000}},
		{"heaviest once, rounding", mix3(0), []int{7, 100, 100}, []int{7, 4, 1}},
		{"fixed draws", mix3(1000), []int{10, 10, 10}, []int{600, 300, 100}},
		{"largest remainder", mix3(11), []int{10, 10, 10}, []int{7, 3, 1}},
		{"cap", mix3(1000, 0, 120), []int{10, 10, 10}, []int{600, 120, 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MixtureCounts(tc.m, tc.sizes)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("counts %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := MixtureCounts(mix3(0), []int{10, 0, 10}); !errors.Is(err, ErrInvalidMixture) || !strings.Contains(err.Error(), "coco") {
		t.Fatalf("empty source: %v, want ErrInvalidMixture naming coco", err)
	}
	if _, err := MixtureCounts(mix3(0), []int{2, 10, 10}); !errors.Is(err, ErrInvalidMixture) || !strings.Contains(err.Error(), `"own" gets no draw`) {
		t.Fatalf("a source rounded to no draws: %v, want ErrInvalidMixture naming own", err)
	}
}

// TestMixtureProportions: 6:3:1 over an epoch are realised within ±1%, and
// so is every prefix of at least 1000 draws (the stride interleaving).
func TestMixtureProportions(t *testing.T) {
	sizes := []int{6000, 2000, 300}
	m := mix3(0)
	counts, err := MixtureCounts(m, sizes)
	if err != nil {
		t.Fatal(err)
	}
	for _, seed := range []uint64{0, 1, 42} {
		draws := MixtureOrder(sizes, counts, seed, 3)
		if len(draws) != 10000 {
			t.Fatalf("seed %d: %d draws, want 10000", seed, len(draws))
		}
		got := make([]int, 3)
		for k, d := range draws {
			got[d.Source]++
			if n := k + 1; n >= 1000 && n%500 == 0 {
				for i, s := range m.Sources {
					share := float64(got[i]) / float64(n)
					if math.Abs(share-s.Weight/10) > 0.01 {
						t.Fatalf("seed %d: after %d draws source %s has share %.4f, want %.2f ±0.01", seed, n, s.Name, share, s.Weight/10)
					}
				}
			}
		}
	}
}

// TestMixtureDraws: each draw of a source is distinct; a source drawn more
// often than it has samples repeats every sample before any sample a
// third time, and its repetitions get distinct draw ids.
func TestMixtureDraws(t *testing.T) {
	sizes := []int{6000, 3000, 300} // own: 1000 draws of 300 samples
	counts, err := MixtureCounts(mix3(0), sizes)
	if err != nil {
		t.Fatal(err)
	}
	draws := MixtureOrder(sizes, counts, 7, 0)
	seen := map[string]bool{}
	perSample := map[[2]int32]int{}
	for _, d := range draws {
		id := DrawID(fmt.Sprintf("%d/%d", d.Source, d.Sample), int(d.Repeat))
		if seen[id] {
			t.Fatalf("draw id %s twice", id)
		}
		seen[id] = true
		k := [2]int32{d.Source, d.Sample}
		if int(d.Repeat) != perSample[k] {
			t.Fatalf("draw %v: repeat %d, want %d", d, d.Repeat, perSample[k])
		}
		perSample[k]++
	}
	for k, n := range perSample {
		if max := (counts[k[0]] + sizes[k[0]] - 1) / sizes[k[0]]; n > max || (k[0] < 2 && n != 1) {
			t.Fatalf("sample %v drawn %d times (source draws %d of %d samples)", k, n, counts[k[0]], sizes[k[0]])
		}
	}
	if got := len(perSample); got != 6000+3000+300 {
		t.Fatalf("%d distinct samples drawn, want every sample of every source (9300)", got)
	}
}

// TestMixtureOrderDeterministic: a pure function of (sizes, counts, seed,
// epoch); other seeds and epochs give other orders.
func TestMixtureOrderDeterministic(t *testing.T) {
	sizes, counts := []int{60, 30, 10}, []int{60, 30, 10}
	a := MixtureOrder(sizes, counts, 5, 2)
	if b := MixtureOrder(sizes, counts, 5, 2); !slices.Equal(a, b) {
		t.Fatal("same inputs, different orders")
	}
	if b := MixtureOrder(sizes, counts, 5, 3); slices.Equal(a, b) {
		t.Fatal("epochs 2 and 3 give the same order")
	}
	if b := MixtureOrder(sizes, counts, 6, 2); slices.Equal(a, b) {
		t.Fatal("seeds 5 and 6 give the same order")
	}
}

func TestDrawBase(t *testing.T) {
	for _, tc := range []struct {
		id   string
		base string
		rep  int
		ok   bool
	}{
		{"a/x#2", "a/x", 2, true}, {"a#b#10", "a#b", 10, true}, {"x", "", 0, false}, {"x#", "", 0, false},
		{"x#0", "", 0, false}, {"x#02", "", 0, false}, {"x#-1", "", 0, false}, {"x#1a", "", 0, false},
		{"x#99999999999999999999", "", 0, false},
	} {
		base, rep, ok := DrawBase(tc.id)
		if base != tc.base || rep != tc.rep || ok != tc.ok {
			t.Errorf("DrawBase(%q) = %q, %d, %v, want %q, %d, %v", tc.id, base, rep, ok, tc.base, tc.rep, tc.ok)
		}
		if tc.ok && DrawID(base, rep) != tc.id {
			t.Errorf("DrawID(%q, %d) = %q, want %q", base, rep, DrawID(base, rep), tc.id)
		}
	}
}

func TestParseMixture(t *testing.T) {
	good := "draws: 100\nsources:\n  - {name: web, path: web.jsonl, weight: 6, cap: 50, text_field: caption}\n  - {path: sub/coco.tar, weight: 3, root: imgs}\n"
	m, err := ParseMixture([]byte(good), "/data")
	if err != nil {
		t.Fatal(err)
	}
	want := []MixtureSource{
		{Name: "web", Path: filepath.Join("/data", "web.jsonl"), Weight: 6, Cap: 50, TextField: "caption"},
		{Name: "coco", Path: filepath.Join("/data", "sub/coco.tar"), Weight: 3, Root: filepath.Join("/data", "imgs")},
	}
	if m.Draws != 100 || !slices.Equal(m.Sources, want) {
		t.Fatalf("parsed %+v, want draws 100 and %+v", m, want)
	}
	if o := m.Sources[0].Options(DefaultOptions()); o.TextColumn != "caption" || o.ImageColumn != "image" {
		t.Fatalf("options %+v: want text column caption, image column image", o)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"empty", "", "no sources"},
		{"no sources", "sources: []", "no sources"},
		{"unknown key", "sources:\n  - {path: a, weight: 1, wieght: 2}", "wieght"},
		{"unknown top key", "draw: 3\nsources:\n  - {path: a, weight: 1}", "draw"},
		{"zero weight", "sources:\n  - {path: a, weight: 0}", "weight"},
		{"negative weight", "sources:\n  - {path: a, weight: -1}", "weight"},
		{"nan weight", "sources:\n  - {path: a, weight: .nan}", "weight"},
		{"inf weight", "sources:\n  - {path: a, weight: .inf}", "weight"},
		{"string weight", "sources:\n  - {path: a, weight: heavy}", "heavy"},
		{"negative cap", "sources:\n  - {path: a, weight: 1, cap: -3}", "cap"},
		{"negative draws", "draws: -1\nsources:\n  - {path: a, weight: 1}", "draws"},
		{"no path", "sources:\n  - {name: a, weight: 1}", "no path"},
		{"duplicate name", "sources:\n  - {path: x/a.jsonl, weight: 1}\n  - {path: y/a.tar, weight: 1}", "also used"},
		{"bad name", "sources:\n  - {name: a/b, path: a, weight: 1}", "name"},
		{"bad format", "sources:\n  - {path: a, weight: 1, format: csv}", "csv"},
		{"duplicate key", "sources:\n  - {path: a, weight: 1, weight: 2}", "weight"},
		{"two documents", "sources:\n  - {path: a, weight: 1}\n---\nsources: []", "document"},
		{"not a map", "[1, 2]", "unmarshal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseMixture([]byte(tc.yaml), "")
			if !errors.Is(err, ErrInvalidMixture) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrInvalidMixture mentioning %q", err, tc.want)
			}
		})
	}
}

func TestLoadMixtureFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadMixture(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("missing file: %v, want an error naming it", err)
	}
	big := filepath.Join(dir, "big.yaml")
	writeFile(t, big, []byte(strings.Repeat("#", MaxMixtureBytes+1)))
	if _, err := LoadMixture(big); !errors.Is(err, ErrInvalidMixture) {
		t.Fatalf("oversized file: %v, want ErrInvalidMixture", err)
	}
	if _, err := LoadMixture(dir); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("a folder: %v, want ErrNotRegular", err)
	}
}

// FuzzParseMixture: hostile definitions give an error or a valid mixture,
// never a panic or a mixture that fails Validate.
func FuzzParseMixture(f *testing.F) {
	f.Add([]byte("sources:\n  - {path: a, weight: 6}\n  - {path: b, weight: 3, cap: 2}\n"))
	f.Add([]byte("a: &a [*a, *a]\nsources: *a"))
	f.Add([]byte("sources:\n  - &x {path: a, weight: 1}\n  - *x\n"))
	f.Add([]byte("{draws: 1e99, sources: [{path: a, weight: 1e308}]}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMixture(b, "")
		if err != nil {
			if !errors.Is(err, ErrInvalidMixture) {
				t.Fatalf("error %v does not wrap ErrInvalidMixture", err)
			}
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("parsed mixture fails Validate: %v", err)
		}
		sizes := make([]int, len(m.Sources))
		for i := range sizes {
			sizes[i] = 3
		}
		counts, err := MixtureCounts(m, sizes)
		if err != nil {
			return
		}
		if total := sumInts(counts); total <= 10000 {
			if got := len(MixtureOrder(sizes, counts, 1, 1)); got != total {
				t.Fatalf("%d draws, want %d", got, total)
			}
		}
	})
}

func sumInts(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// BenchmarkMixtureOrder orders an epoch of 1M draws of a 6:3:1 mixture
// (the heaviest source once through, the lightest repeated): compare with
// BenchmarkPermutation/samples=1000000, the order of one dataset of that size.
func BenchmarkMixtureOrder(b *testing.B) {
	sizes := []int{600_000, 300_000, 50_000}
	counts, err := MixtureCounts(mix3(0), sizes)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		MixtureOrder(sizes, counts, 1, 2)
	}
}
