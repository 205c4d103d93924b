package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/mmfeed/mmfeed/pipeline"
)

// TestShardSummaryAndPlanMatchTheFiles: on a dataset whose truncated PNGs
// pass the feature pass (their header is whole) and fail to decode, and
// whose other bad samples are quarantined earlier, `mmfeed shard` counts each such sample
// once, as quarantined (the summary's planned + quarantined + dropped = seen),
// and plan.jsonl gives every row the weight the epoch index stores (0 for
// those samples), row for row.
func TestShardSummaryAndPlanMatchTheFiles(t *testing.T) {
	input := truncatedPNGs(t, 14, 3)
	out := filepath.Join(t.TempDir(), "shards")
	stdout := mmfeed(t, "shard", "--input", input, "--dp", "2", "--global-batch", "4", "--micro-batches", "1",
		"--image-size", "32", "--workers", "2", "--feature-cache", "off", "--out", out)
	m := regexp.MustCompile(`(\d+) samples seen, (\d+) planned in [^,]*, (\d+) quarantined( \((\d+) of them failed to decode[^)]*\))?, (\d+) dropped`).FindStringSubmatch(stdout)
	if m == nil {
		t.Fatalf("no summary line in %q", stdout)
	}
	n := func(s string) int { v, _ := strconv.Atoi(s); return v }
	seen, planned, quarantined, dropped := n(m[1]), n(m[2]), n(m[3]), n(m[6])
	q, err := os.ReadFile(filepath.Join(out, "quarantine.jsonl"))
	must(t, err)
	if failed := bytes.Count(q, []byte(`"reason":"image_corrupt"`)); failed != 3 || n(m[5]) != failed {
		t.Errorf("%d decode failures quarantined, the summary says %q; want 3 in both", failed, m[4])
	}
	if planned+quarantined+dropped != seen {
		t.Errorf("planned %d + quarantined %d + dropped %d != seen %d: %q", planned, quarantined, dropped, seen, stdout)
	}
	plan := planRows(t, filepath.Join(out, "plan.jsonl"))
	stored := indexRows(t, filepath.Join(out, pipeline.IndexFile(0)))
	if fmt.Sprint(plan) != fmt.Sprint(stored) {
		t.Errorf("plan.jsonl rows differ from the epoch index:\nplan  %v\nindex %v", plan, stored)
	}
	ones := 0
	for _, rows := range plan {
		for _, r := range rows {
			if r.weight > 0 {
				ones++
			}
		}
	}
	if ones != planned {
		t.Errorf("plan.jsonl has %d rows of weight 1, the summary says %d planned", ones, planned)
	}
}

// truncatedPNGs writes a manifest of good 24×24 PNGs, the first bad of them cut
// short inside their pixel data, and one line with a missing image.
func truncatedPNGs(t *testing.T, good, bad int) string {
	t.Helper()
	dir := t.TempDir()
	var lines bytes.Buffer
	for i := range good + bad {
		img := image.NewNRGBA(image.Rect(0, 0, 24, 24))
		for p := range img.Pix {
			img.Pix[p] = byte(p*7 + i*13)
		}
		var b bytes.Buffer
		must(t, png.Encode(&b, img))
		data := b.Bytes()
		if i < bad {
			data = data[:len(data)*2/3]
		}
		name := fmt.Sprintf("%02d.png", i)
		must(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
		fmt.Fprintf(&lines, `{"image":%q,"text":"caption number %d"}`+"\n", name, i)
	}
	lines.WriteString(`{"image":"missing.png","text":"no file"}` + "\n")
	p := filepath.Join(dir, "manifest.jsonl")
	must(t, os.WriteFile(p, lines.Bytes(), 0o644))
	return p
}

// shardRow is one planned row as plan.jsonl and the epoch index both give it.
type shardRow struct {
	id       string
	step, mb int
	weight   float32
}

// planRows reads plan.jsonl's planned rows, per rank in file order.
func planRows(t *testing.T, path string) map[int][]shardRow {
	t.Helper()
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	out := map[int][]shardRow{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l struct {
			ID         string   `json:"id"`
			Step       int      `json:"step"`
			Rank       int      `json:"rank"`
			MicroBatch int      `json:"micro_batch"`
			Weight     *float32 `json:"weight"`
		}
		must(t, json.Unmarshal(sc.Bytes(), &l))
		if l.Weight != nil {
			out[l.Rank] = append(out[l.Rank], shardRow{l.ID, l.Step, l.MicroBatch, *l.Weight})
		}
	}
	return out
}

// indexRows reads an epoch index (one record per rank).
func indexRows(t *testing.T, path string) map[int][]shardRow {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	r, err := ipc.NewFileReader(bytes.NewReader(b), ipc.WithAllocator(memory.NewGoAllocator()))
	must(t, err)
	defer r.Close()
	out := map[int][]shardRow{}
	for rank := range r.NumRecords() {
		rec, err := r.RecordBatch(rank)
		must(t, err)
		ids, steps, mbs := rec.Column(0).(*array.String), rec.Column(1).(*array.Int32), rec.Column(2).(*array.Int32)
		ws := rec.Column(6).(*array.Float32)
		for i := range int(rec.NumRows()) {
			out[rank] = append(out[rank], shardRow{ids.Value(i), int(steps.Value(i)), int(mbs.Value(i)), ws.Value(i)})
		}
	}
	return out
}
