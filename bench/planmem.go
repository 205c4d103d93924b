package main

import (
	"context"
	"flag"
	"fmt"
	"hash/fnv"
	"image"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/pipeline"
)

var planMemSamples = flag.Int("plan-memory-samples", 10_000_000, "plan_memory: samples in the generated manifest")

// benchPlanMemory: the planner's resident memory per indexed sample (issue 21). It writes an
// N-line manifest (the 2,000-sample synth corpus's images and captions, distinct ids, as
// report1m does), then holds what `mmfeed report` and serve's planner hold after the
// feature pass, through the real code: pipeline.OpenDataset (the loader index),
// Dataset.Epoch (the dataset's per-index feature records and the epoch's ordered
// Features), and Prepared.Plan (one plan, dp 64 × 4 micro-batches, global batch 2048).
// The feature pass is synthesised (Config.Features, as a planner's workers or the feature
// cache deliver it: ids and formats decoded into their own strings), so no header of 10M
// images is read. After each stage: runtime.GC, debug.FreeOSMemory, then HeapInuse and
// VmRSS; the per-stage deltas divided by N are the bytes per sample. Keys:
// plan_memory_<N>_*, N as 10m, 1m, 100k (-plan-memory-samples). The accounted
// figures split the features stage by the size of what each slice holds.
func benchPlanMemory(env *benchEnv) (map[string]float64, error) {
	n := *planMemSamples
	input, _, err := benchInput(env, 2000)
	if err != nil {
		return nil, err
	}
	big := filepath.Join(filepath.Dir(input), fmt.Sprintf("manifest-planmem-%d.jsonl", n))
	if err := writeBigManifest(input, big, n); err != nil {
		return nil, err
	}
	defer os.Remove(big)
	m := newMemMeter()
	cfg := pipeline.DefaultConfig()
	cfg.Input = big
	cfg.Workers = 1
	cfg.Features = synthFeatures
	start := time.Now()
	d, err := pipeline.OpenDataset(context.Background(), cfg, io.Discard)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if got := d.Index.Len(); got != n {
		return nil, fmt.Errorf("plan_memory: index holds %d of %d samples", got, n)
	}
	index := m.stage()
	plan := balancer.DefaultConfig()
	plan.DP, plan.MicroBatches, plan.GlobalBatch = 64, 4, 2048
	p, err := d.Epoch(context.Background(), plan, io.Discard)
	if err != nil {
		return nil, err
	}
	features := m.stage()
	pl, err := p.Plan(plan.Strategy)
	if err != nil {
		return nil, err
	}
	planned := m.stage()
	secs := time.Since(start).Seconds()
	per := func(b int64) float64 { return float64(b) / float64(n) }
	acc := accountFeatures(p.Features)
	ixStructs := d.Index.EntryBytes()
	k := "plan_memory_" + samplesLabel(n) + "_"
	out := map[string]float64{
		k + "samples":                          float64(n),
		k + "bytes_per_sample":                 per(m.heap - m.base.heap),
		k + "rss_bytes_per_sample":             per(m.rss - m.base.rss),
		k + "entries_bytes_per_sample":         per(index.heap),
		k + "features_bytes_per_sample":        per(features.heap),
		k + "plan_bytes_per_sample":            per(planned.heap),
		k + "index_structs_bytes_per_sample":   per(ixStructs),
		k + "index_strings_bytes_per_sample":   per(index.heap - ixStructs),
		k + "ordered_entries_bytes_per_sample": per(acc.entries),
		k + "items_bytes_per_sample":           per(acc.items),
		k + "sizes_formats_bytes_per_sample":   per(acc.sizes + acc.formats),
		k + "feature_records_bytes_per_sample": per(features.heap - acc.entries - acc.items - acc.sizes - acc.formats),
		k + "seconds":                          secs,
	}
	fmt.Printf("   %d samples, %d steps, %.0fs: heap %.0f B/sample (index %.0f, features %.0f, plan %.0f), RSS %.0f B/sample above a %.0f MB baseline\n",
		n, len(pl.Steps), secs, out[k+"bytes_per_sample"], per(index.heap), per(features.heap), per(planned.heap),
		out[k+"rss_bytes_per_sample"], float64(m.base.rss)/1e6)
	runtime.KeepAlive(p)
	runtime.KeepAlive(pl)
	return out, nil
}

// synthFeatures stands for a feature pass: every entry gets a plausible item (text tokens
// from the caption's length, image tokens and size from a hash of the id) with the id and
// format in strings of their own, as decoding a cached or a worker's record gives them.
func synthFeatures(_ context.Context, ix *loader.Index) ([]pipeline.EntryFeatures, error) {
	all := make([]pipeline.EntryFeatures, ix.Len())
	for lo := 0; lo < ix.Len(); lo += 4096 {
		for j, e := range ix.Entries(lo, min(ix.Len(), lo+4096)) {
			all[lo+j] = synthFeature(e)
		}
	}
	return all, nil
}

// synthFeature is entry e's synthetic features.
func synthFeature(e loader.Entry) pipeline.EntryFeatures {
	h := fnv.New64a()
	io.WriteString(h, e.ID)
	v := h.Sum64()
	w, ht := 224+int(v%800), 224+int((v>>10)%800)
	return pipeline.EntryFeatures{
		Item: balancer.Item{ID: strings.Clone(e.ID), TextTokens: 2 + len(e.Text)/4,
			ImageTokens: (w / 14) * (ht / 14), Complexity: float64(v%1000) / 1000},
		Size:   image.Pt(w, ht),
		Format: strings.Clone(imgproc.FormatJPEG),
	}
}

// featureBytes is what the ordered Features' slices hold, by slice (strings they share
// with the index are not counted).
type featureBytes struct{ entries, items, sizes, formats int64 }

func accountFeatures(f pipeline.Features) featureBytes {
	return featureBytes{
		entries: int64(cap(f.Order)) * int64(unsafe.Sizeof(int32(0))),
		items:   int64(cap(f.Items)) * int64(unsafe.Sizeof(balancer.Item{})),
		sizes:   int64(cap(f.Sizes)) * int64(unsafe.Sizeof(image.Point{})),
		formats: f.FormatBytes(),
	}
}

// memMeter measures the heap in use and the resident set after a full collection.
type memMeter struct {
	base, last memSample
	heap, rss  int64
}

type memSample struct{ heap, rss int64 }

func newMemMeter() *memMeter {
	m := &memMeter{}
	m.base = readMem()
	m.last = m.base
	return m
}

// stage returns the growth since the previous stage.
func (m *memMeter) stage() memSample {
	s := readMem()
	d := memSample{heap: s.heap - m.last.heap, rss: s.rss - m.last.rss}
	m.last, m.heap, m.rss = s, s.heap, s.rss
	return d
}

func readMem() memSample {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSample{heap: int64(ms.HeapInuse), rss: vmRSS()}
}

// vmRSS is the process's resident set in bytes (VmRSS of /proc/self/status), 0 where
// there is none.
func vmRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// samplesLabel names a sample count in result keys: 10m, 1m, 250k, or the number.
func samplesLabel(n int) string {
	switch {
	case n%1_000_000 == 0:
		return strconv.Itoa(n/1_000_000) + "m"
	case n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}
