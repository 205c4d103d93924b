package balancer

import (
	"encoding/json"
	"math"
	"os"
	"slices"
	"testing"
)

// flopLayouts is testdata/flops_layouts_golden.json, written from the
// trainer by trainer/tests/test_flops_golden.py: the FLOPs the trainer
// counts for whole micro-batches (padded and packed, from the tensors it
// builds) and each pipeline stage's share of one sample.
type flopLayouts struct {
	MicroBatches []struct {
		Preset  string   `json:"preset"`
		Layout  string   `json:"layout"`
		Samples [][3]int `json:"samples"` // text tokens, grid rows, grid columns
		FLOPs   float64  `json:"flops"`
	} `json:"micro_batches"`
	Pipeline []struct {
		Preset      string    `json:"preset"`
		PP          int       `json:"pp"`
		TextTokens  int       `json:"text_tokens"`
		ImageTokens int       `json:"image_tokens"`
		StageFLOPs  []float64 `json:"stage_flops"`
	} `json:"pipeline"`
}

// TestFLOPLayoutsMatchTrainer: for every preset, the Go FLOP prior of a
// padded micro-batch (PaddedFeatures) and of a packed one (PackedFeatures)
// equals the trainer's count of the same micro-batch, and under pipeline
// parallelism the trainer's stages together do the work Go prices for the
// sample (every block on exactly one stage).
func TestFLOPLayoutsMatchTrainer(t *testing.T) {
	b, err := os.ReadFile("testdata/flops_layouts_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g flopLayouts
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mb := range g.MicroBatches {
		seen[mb.Preset] = true
		shape, err := Preset(mb.Preset)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := NewCostModel(shape)
		var items []Item
		maxL, maxP := 0, 0
		for _, s := range mb.Samples {
			items = append(items, Item{ID: "x", TextTokens: s[0], ImageTokens: s[1] * s[2]})
			maxL, maxP = max(maxL, s[0]), max(maxP, s[1]*s[2])
		}
		var got float64
		switch mb.Layout {
		case "padded":
			got = m.MicroBatchCost(PaddedFeatures(len(items), maxL, maxP, 0), false).Total() / gflop
		case "packed":
			got = m.MicroBatchCost(PackedFeatures(items), true).Total() / gflop
		default:
			t.Fatalf("layout %q", mb.Layout)
		}
		if rel := math.Abs(got-mb.FLOPs) / mb.FLOPs; rel > 1e-12 {
			t.Errorf("%s %s %v: Go %.6g FLOPs, trainer %.6g (%.3g%% apart)", mb.Preset, mb.Layout, mb.Samples, got, mb.FLOPs, 100*rel)
		}
	}
	for _, p := range g.Pipeline {
		seen[p.Preset+"/pp"] = true
		shape, err := Preset(p.Preset)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := NewCostModel(shape)
		if len(p.StageFLOPs) != p.PP {
			t.Errorf("%s pp=%d: %d stages in the golden", p.Preset, p.PP, len(p.StageFLOPs))
		}
		var sum float64
		for _, f := range p.StageFLOPs {
			sum += f
		}
		got := m.Cost(Item{ID: "x", TextTokens: p.TextTokens, ImageTokens: p.ImageTokens}).Total() / gflop
		if rel := math.Abs(got-sum) / sum; rel > 1e-12 {
			t.Errorf("%s pp=%d L=%d P=%d: Go %.6g FLOPs, trainer stages sum to %.6g", p.Preset, p.PP, p.TextTokens, p.ImageTokens, got, sum)
		}
		// PipelineRankCost prices every stage at 1/PP of the sample; the log
		// says how far the trainer's costliest stage is from that.
		t.Logf("%s pp=%d L=%d P=%d: costliest stage %.3f of the even share", p.Preset, p.PP, p.TextTokens, p.ImageTokens,
			slices.Max(p.StageFLOPs)*float64(p.PP)/sum)
	}
	for _, name := range PresetNames() {
		if !seen[name] || !seen[name+"/pp"] {
			t.Errorf("preset %s: no micro-batch or pipeline entries in the golden", name)
		}
	}
}
