package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/loader/synth"
)

// storeFixture is an index of n entries and their features: every seventh a reject, the
// formats cycling through three, the ids decoded into strings of their own.
func storeFixture(n int) (*loader.Index, []EntryFeatures) {
	var entries []loader.Entry
	all := make([]EntryFeatures, n)
	formats := []string{imgproc.FormatJPEG, imgproc.FormatPNG, imgproc.FormatWebP}
	for i := range n {
		id := fmt.Sprintf("%08d-%d", i, i%10)
		entries = append(entries, loader.Entry{ID: id, Location: fmt.Sprintf("m.jsonl:%d", i+1), Text: "a caption"})
		if i%7 == 3 {
			all[i] = EntryFeatures{Reject: &loader.Reject{ID: id, Reason: "unreadable_image", Detail: "x"}}
			continue
		}
		all[i] = EntryFeatures{
			Item:   balancer.Item{ID: strings.Clone(id), TextTokens: 3 + i%50, ImageTokens: (i * 37) % 4096, Complexity: float64(i%13) / 13},
			Size:   image.Pt(100+i%900, 80+i%700),
			Format: strings.Clone(formats[i%3]),
		}
	}
	return loader.IndexOf(entries), all
}

func TestFeatureStoreKeepsEveryFeature(t *testing.T) {
	ix, all := storeFixture(1000)
	s, ok := compactFeatures(ix, all)
	if !ok {
		t.Fatal("compactFeatures refused features that fit")
	}
	for i := range all {
		if got, want := s.at(ix, i), all[i]; !reflect.DeepEqual(got, want) {
			t.Fatalf("entry %d: got %+v, want %+v", i, got, want)
		}
		if got := s.at(ix, i); got.Reject == nil && unsafe.StringData(got.Item.ID) != unsafe.StringData(ix.Entry(i).ID) {
			t.Fatalf("entry %d: id is not the index entry's string", i)
		}
	}
	if got, limit := float64(s.bytes())/float64(len(all)), 26.0; got > limit {
		t.Errorf("store holds %.1f bytes per entry, want ≤ %.0f (an EntryFeatures is %d)", got, limit, unsafe.Sizeof(EntryFeatures{}))
	}
	perm := loader.Permutation(len(all), 7, 1)
	want, err := orderFeatures(ix, all, perm, nil, loader.NewQuarantineWriter(nil))
	if err != nil {
		t.Fatal(err)
	}
	got, err := orderStored(ix, s, perm, nil, loader.NewQuarantineWriter(nil))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Error("ordered features from the store differ from those of the records")
	}
}

func TestFeatureStoreRefusesWhatDoesNotFit(t *testing.T) {
	manyFormats := func(all []EntryFeatures) {
		for i := range all {
			all[i].Reject, all[i].Format = nil, fmt.Sprintf("f%d", i)
			all[i].Item.ID = fmt.Sprintf("%08d-%d", i, i%10)
		}
	}
	tests := []struct {
		name  string
		n     int
		spoil func(all []EntryFeatures)
	}{
		{"another id", 10, func(all []EntryFeatures) { all[2].Item.ID = "other" }},
		{"text tokens beyond int32", 10, func(all []EntryFeatures) { all[1].Item.TextTokens = 1 << 40 }},
		{"image tokens beyond int32", 10, func(all []EntryFeatures) { all[1].Item.ImageTokens = -1 << 40 }},
		{"width beyond int32", 10, func(all []EntryFeatures) { all[5].Size.X = 1 << 33 }},
		{"257 formats", 257, manyFormats},
		{"fewer features than entries", 10, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix, all := storeFixture(tt.n)
			if tt.spoil != nil {
				tt.spoil(all)
			} else {
				all = all[:len(all)-1]
			}
			if _, ok := compactFeatures(ix, all); ok {
				t.Error("compactFeatures accepted features that do not fit its columns")
			}
		})
	}
	ix, all := storeFixture(256)
	manyFormats(all)
	if _, ok := compactFeatures(ix, all); !ok {
		t.Error("compactFeatures refused 256 formats")
	}
}

// TestEpochHoldsLittlePerEntry: what a dataset and its epoch keep per entry beyond the
// index (the stored features, the epoch's order, items, sizes and formats) stays near the
// ~100 bytes those columns take; a copy of every entry (128 bytes) or of every decoded
// feature record (80 bytes and two strings) is over the limit.
func TestEpochHoldsLittlePerEntry(t *testing.T) {
	const n = 20000
	cfg := synth.DefaultConfig()
	cfg.Out, cfg.Samples, cfg.Seed = t.TempDir(), 2, 1
	sum, err := synth.Generate(context.Background(), cfg)
	mustOK(t, err)
	var first struct {
		Image string `json:"image"`
	}
	b, err := os.ReadFile(sum.Path)
	mustOK(t, err)
	mustOK(t, json.Unmarshal(bytes.SplitN(b, []byte("\n"), 2)[0], &first))
	var lines bytes.Buffer
	for i := range n {
		fmt.Fprintf(&lines, "{\"image\":%q,\"text\":\"a caption of sample %d\",\"id\":\"s%07d\"}\n", first.Image, i, i)
	}
	manifest := filepath.Join(filepath.Dir(sum.Path), "big.jsonl")
	mustOK(t, os.WriteFile(manifest, lines.Bytes(), 0o644))
	c := testConfig(manifest)
	c.Features = func(_ context.Context, ix *loader.Index) ([]EntryFeatures, error) {
		all := make([]EntryFeatures, ix.Len())
		for i, e := range ix.All() {
			all[i] = EntryFeatures{Item: balancer.Item{ID: strings.Clone(e.ID), TextTokens: 5 + i%7, ImageTokens: 4},
				Size: image.Pt(64, 48), Format: strings.Clone(imgproc.FormatJPEG)}
		}
		return all, nil
	}
	d, err := OpenDataset(context.Background(), c, nil)
	mustOK(t, err)
	defer d.Close()
	before := heapInUse()
	p, err := d.Epoch(context.Background(), c.Plan, nil)
	mustOK(t, err)
	per := float64(heapInUse()-before) / n
	if p.Features.Len() != n {
		t.Fatalf("%d entries planned, want %d", p.Features.Len(), n)
	}
	t.Logf("%.0f bytes per entry", per)
	if limit := 140.0; per > limit {
		t.Errorf("the epoch holds %.0f bytes per entry beyond the index, want ≤ %.0f", per, limit)
	}
	runtime.KeepAlive(p)
}

func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}
