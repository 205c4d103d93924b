package pipeline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
)

// TestSwappedImageQuarantined: an indexed image swapped for a link to a
// same-size file outside the dataset root is quarantined as escapes_root and
// never delivered, whether the swap comes before the feature pass (its header
// read is refused) or after the plan (the read of its bytes is refused, its
// row stored at weight 0).
func TestSwappedImageQuarantined(t *testing.T) {
	for _, stage := range []string{"features", "preprocess"} {
		t.Run(stage, func(t *testing.T) {
			input := corpus(t, 40, "jsonl")
			cfg := testConfig(input)
			cfg.Plan.DP, cfg.Plan.MicroBatches, cfg.Plan.GlobalBatch = 2, 1, 8
			var q bytes.Buffer
			d, err := OpenDataset(context.Background(), cfg, &q)
			mustOK(t, err)
			defer d.Close()
			var victim string
			if stage == "features" {
				victim = d.Index.Entry(0).ID
				swapOutside(t, d.Index.Entry(0))
			}
			prep, err := d.Epoch(context.Background(), cfg.Plan, &q)
			mustOK(t, err)
			plan, err := prep.Plan(balancer.StrategyMmfeed)
			mustOK(t, err)
			if stage == "preprocess" {
				e := prep.Features.Entry(int(plan.Steps[0].Ranks[0][0][0].Item))
				victim = e.ID
				swapOutside(t, e)
			}
			sum, err := WriteShards(context.Background(), prep, plan, t.TempDir(), nil)
			mustOK(t, err)
			for _, f := range sum.Files {
				readShard(t, f, func(id string, w float32) {
					if id == victim && w > 0 {
						t.Errorf("swapped sample %s delivered with weight %v", id, w)
					}
				})
			}
			rejects, err := loader.ReadQuarantine(&q)
			mustOK(t, err)
			var reasons []string
			for _, r := range rejects {
				if r.ID == victim {
					reasons = append(reasons, r.Reason)
				}
			}
			if len(reasons) == 0 || reasons[len(reasons)-1] != loader.ReasonEscapesRoot {
				t.Errorf("swapped sample %s quarantined as %v, want escapes_root", victim, reasons)
			}
		})
	}
}

// swapOutside replaces the image of the manifest entry e by a link to a copy
// of it (same size) outside the dataset root.
func swapOutside(t *testing.T, e loader.Entry) {
	t.Helper()
	manifest, n, ok := strings.Cut(e.Location, ":")
	line, err := strconv.Atoi(n)
	if !ok || err != nil {
		t.Fatalf("location %q is not manifest:line", e.Location)
	}
	f, err := os.Open(manifest)
	mustOK(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for i := 0; i < line && sc.Scan(); i++ {
	}
	var ml struct{ Image string }
	mustOK(t, json.Unmarshal(sc.Bytes(), &ml))
	img := filepath.Join(filepath.Dir(manifest), filepath.FromSlash(ml.Image))
	data, err := os.ReadFile(img)
	mustOK(t, err)
	outside := filepath.Join(t.TempDir(), "outside.jpg")
	mustOK(t, os.WriteFile(outside, data, 0o644))
	mustOK(t, os.Remove(img))
	mustOK(t, os.Symlink(outside, img))
}
