package balancer

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"testing"
)

func near(got, want float64) bool {
	return math.Abs(got-want) <= 1e-12*math.Max(1, math.Abs(want))
}

// The coefficients below are computed by hand in docs/cost-model.md (FLOPs).
// The vision tower and the fusion's keys and values see P + 1 tokens (the
// [CLS] token): with t and a the vision costs per token and per token pair,
// P: t + 2a, P²: a, 1: t + a; fusion L gains the LP and 1 the P coefficient.
func TestShapeCoefficients(t *testing.T) {
	tests := []struct {
		name  string
		shape ModelShape
		want  map[Component]map[Feature]float64 // FLOPs; unlisted entries are 0
	}{
		{"tiny", TinyShape(), map[Component]map[Feature]float64{
			// t = 884,736, a = 1,536
			Vision: {FeatP: 887_808, FeatP2: 1_536, FeatOne: 886_272},
			Text:   {FeatL: 589_824, FeatL2: 1_536},
			// 3 passes × 3 (training) × (1·(12+16)·64² + 4·64, 4·64, 4·64·64, 4·64, 4·64·64)
			Fusion: {FeatL: 1_034_496, FeatL2: 2_304, FeatP: 147_456, FeatLP: 2_304, FeatOne: 147_456},
		}},
		{"base", BaseShape(), map[Component]map[Feature]float64{
			// t = 513,146,880, a = 110,592
			Vision: {FeatP: 513_368_064, FeatP2: 110_592, FeatOne: 513_257_472},
			Text:   {FeatL: 509_607_936, FeatL2: 110_592},
			Fusion: {FeatL: 891_979_776, FeatL2: 165_888, FeatP: 127_401_984, FeatLP: 165_888, FeatOne: 127_401_984},
		}},
		{"no fusion, projections", ModelShape{VisionHidden: 32, VisionLayers: 1, PatchSize: 2, ImageChannels: 1,
			TextHidden: 16, TextLayers: 1, FusionHidden: 8, FusionLayers: 0, MLPRatio: 2}, map[Component]map[Feature]float64{
			// t = 3·(2·1·4·32 + 1·(8+8)·32²) = 3·(256+16384) = 49,920; a = 3·4·32 = 384
			Vision: {FeatP: 50_688, FeatP2: 384, FeatOne: 50_304},
			// L: 3·16·16²; L²: 3·4·16
			Text: {FeatL: 12_288, FeatL2: 192},
		}},
		{"fusion projections", ModelShape{VisionHidden: 32, VisionLayers: 0, PatchSize: 1, ImageChannels: 1,
			TextHidden: 16, TextLayers: 0, FusionHidden: 8, FusionLayers: 2, MLPRatio: 1}, map[Component]map[Feature]float64{
			Vision: {FeatP: 3 * 2 * 32, FeatOne: 3 * 2 * 32},
			// 3 passes × 3 (training) × L: 2·(8+4+4)·64 + 2·16·8 (+ LP's 2·4·8);
			// L²: 2·4·8; P and 1: 2·4·32·8 (keys and values from the vision
			// width); LP: 2·4·8
			Fusion: {FeatL: 9 * (2048 + 256 + 64), FeatL2: 9 * 64, FeatP: 9 * 2048, FeatLP: 9 * 64, FeatOne: 9 * 2048},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.shape.Coefficients()
			for c := range NumComponents {
				for f := range NumFeatures {
					want := tt.want[c][f] * 1e-9
					if !near(got[c][f], want) {
						t.Errorf("%v %v: got %v GFLOP, want %v", c, f, got[c][f], want)
					}
				}
			}
		})
	}
}

// The worked example of docs/cost-model.md.
func TestWorkedExample(t *testing.T) {
	m, err := NewCostModel(TinyShape())
	if err != nil {
		t.Fatal(err)
	}
	got := m.Cost(Item{ID: "x", TextTokens: 32, ImageTokens: 196, Complexity: 0.5})
	want := Cost{Vision: 0.233903616, Text: 0.020447232, Fusion: 0.078962688}
	if !near(got.Vision, want.Vision) || !near(got.Text, want.Text) || !near(got.Fusion, want.Fusion) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if got, want := Colocated.StepCost(got), 0.333313536; !near(got, want) {
		t.Errorf("colocated: got %v, want %v", got, want)
	}
	if got, want := Modality.StepCost(got), 0.312866304; !near(got, want) {
		t.Errorf("modality: got %v, want %v", got, want)
	}
}

func TestPlacementStepCost(t *testing.T) {
	tests := []struct {
		c         Cost
		colocated float64
		modality  float64
	}{
		{Cost{1, 2, 3}, 6, 5},
		{Cost{5, 2, 1}, 8, 6},
		{Cost{0, 0, 0}, 0, 0},
		{Cost{2, 2, 0}, 4, 2},
	}
	for _, tt := range tests {
		if got := Colocated.StepCost(tt.c); got != tt.colocated {
			t.Errorf("colocated %+v: got %v, want %v", tt.c, got, tt.colocated)
		}
		if got := Modality.StepCost(tt.c); got != tt.modality {
			t.Errorf("modality %+v: got %v, want %v", tt.c, got, tt.modality)
		}
	}
}

func TestCostIsLinearInFeatures(t *testing.T) {
	m, _ := NewCostModel(BaseShape())
	items := genItems(50, genDynamic, 3)
	var sum Features
	var direct Cost
	for _, it := range items {
		sum = sum.Add(FeaturesOf(it.TextTokens, it.ImageTokens, it.Complexity))
		direct = direct.Add(m.Cost(it))
	}
	got := m.CostOf(sum)
	for _, pair := range [][2]float64{{got.Vision, direct.Vision}, {got.Text, direct.Text}, {got.Fusion, direct.Fusion}} {
		if math.Abs(pair[0]-pair[1]) > 1e-9*pair[1] {
			t.Errorf("cost of summed features %v, sum of costs %v", pair[0], pair[1])
		}
	}
}

func TestParseNames(t *testing.T) {
	tests := []struct {
		in   string
		ok   bool
		want string
		fn   func(string) (string, error)
	}{
		{"modality", true, "modality", parseP},
		{" Colocated ", true, "colocated", parseP},
		{"", true, "colocated", parseP},
		{"mp", false, "", parseP},
		{"length-grouped", true, "length_grouped", parseS},
		{"RANDOM", true, "random", parseS},
		{"lpt", false, "", parseS},
		{"pad", true, "pad", parseT},
		{"keep", false, "", parseT},
		{"base", true, "base", parseM},
		{"huge", false, "", parseM},
		{"micro-batch", true, "micro-batch", parseY},
		{"MicroBatch", true, "micro-batch", parseY},
		{" step", true, "step", parseY},
		{"epoch", false, "", parseY},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := tt.fn(tt.in)
			if tt.ok != (err == nil) || got != tt.want {
				t.Fatalf("got %q, %v; want %q (ok=%v)", got, err, tt.want, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrUnknownName) {
				t.Errorf("error %v is not ErrUnknownName", err)
			}
		})
	}
}

func parseP(s string) (string, error) { v, err := ParsePlacement(s); return str(v, err) }
func parseS(s string) (string, error) { v, err := ParseStrategy(s); return str(v, err) }
func parseT(s string) (string, error) { v, err := ParseTail(s); return str(v, err) }
func parseY(s string) (string, error) { v, err := ParseSync(s); return str(v, err) }
func parseM(s string) (string, error) { v, err := Preset(s); return v.Name, err }

func str(v interface{ String() string }, err error) (string, error) {
	if err != nil {
		return "", err
	}
	return v.String(), nil
}

func TestValidateRejects(t *testing.T) {
	shape := TinyShape()
	shape.MLPRatio = 0
	cfgs := map[string]error{
		"shape":      shape.Validate(),
		"model":      CostModel{Coef: Coefficients{Vision: {FeatP: -1}}}.Validate(),
		"complexity": CostModel{Coef: Coefficients{Vision: {FeatComplexity: 0.02}}}.Validate(),
		"budget":     Budget{MaxSamples: -1}.Validate(),
		"dp":         PartitionConfig{DP: 0, MicroBatches: 1, PaddingTarget: 1}.Validate(),
		"padding":    PartitionConfig{DP: 1, MicroBatches: 1, PaddingTarget: 1.5}.Validate(),
		"both sizes": func() error { c := DefaultConfig(); c.GlobalTokens = 10; return c.Validate() }(),
		"small":      func() error { c := DefaultConfig(); c.GlobalBatch = 31; return c.Validate() }(),
		"lookahead":  func() error { c := DefaultConfig(); c.Lookahead = 0; return c.Validate() }(),
		"sync":       func() error { c := DefaultConfig(); c.Sync = 7; return c.Validate() }(),
	}
	for name, err := range cfgs {
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: got %v, want ErrInvalidConfig", name, err)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("default config: %v", err)
	}
	for _, it := range []Item{{TextTokens: -1, ImageTokens: 1}, {TextTokens: 1, Complexity: math.NaN()}, {}, {TextTokens: MaxItemTokens + 1}} {
		if err := it.Validate(); !errors.Is(err, ErrInvalidItem) {
			t.Errorf("item %+v: got %v, want ErrInvalidItem", it, err)
		}
	}
}

// The Go FLOP prior agrees with the trainer's own count
// (trainer/mmfeed_trainer/models/model.py flops_per_sample, pinned in
// testdata/flops_golden.json by trainer/tests/test_model.py) exactly (up to
// rounding): both count the [CLS] token the trainer prepends to the patches.
func TestFLOPsMatchTrainer(t *testing.T) {
	b, err := os.ReadFile("testdata/flops_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var golden []struct {
		Preset      string  `json:"preset"`
		TextTokens  int     `json:"text_tokens"`
		ImageTokens int     `json:"image_tokens"`
		FLOPs       float64 `json:"flops"`
	}
	if err := json.Unmarshal(b, &golden); err != nil {
		t.Fatal(err)
	}
	if len(golden) == 0 {
		t.Fatal("empty golden file")
	}
	for _, g := range golden {
		shape, err := Preset(g.Preset)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := NewCostModel(shape)
		got := m.Cost(Item{ID: "x", TextTokens: g.TextTokens, ImageTokens: g.ImageTokens}).Total() / gflop
		if rel := math.Abs(got-g.FLOPs) / g.FLOPs; rel > 1e-12 {
			t.Errorf("%s L=%d P=%d: Go %.4g FLOPs, trainer %.4g (%.2f%% apart)", g.Preset, g.TextTokens, g.ImageTokens, got, g.FLOPs, 100*rel)
		}
	}
}

// The same agreement for micro-batches, as the trainer computes them: padded,
// every entry at the micro-batch's longest caption and largest image
// (PaddedFeatures: n × the trainer's count at (L_max, P_max)); packed, each
// sample on its own (PackedFeatures: Σ of the trainer's counts). Each
// micro-batch pairs golden samples one of which has both maxima, so both
// sides are sums of golden counts.
func TestFLOPsMatchTrainerMicroBatches(t *testing.T) {
	b, err := os.ReadFile("testdata/flops_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var golden []struct {
		Preset      string  `json:"preset"`
		TextTokens  int     `json:"text_tokens"`
		ImageTokens int     `json:"image_tokens"`
		FLOPs       float64 `json:"flops"`
	}
	if err := json.Unmarshal(b, &golden); err != nil {
		t.Fatal(err)
	}
	type sample struct{ l, p int }
	flops := map[string]map[sample]float64{}
	for _, g := range golden {
		if flops[g.Preset] == nil {
			flops[g.Preset] = map[sample]float64{}
		}
		flops[g.Preset][sample{g.TextTokens, g.ImageTokens}] = g.FLOPs
	}
	mbs := [][]sample{{{32, 196}, {128, 1024}}, {{32, 196}, {32, 196}, {128, 1024}}}
	for _, preset := range []string{"tiny", "base"} {
		shape, err := Preset(preset)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := NewCostModel(shape)
		for _, mb := range mbs {
			var items []Item
			var packed float64
			maxL, maxP := 0, 0
			for _, s := range mb {
				items = append(items, Item{ID: "x", TextTokens: s.l, ImageTokens: s.p})
				packed += flops[preset][s]
				maxL, maxP = max(maxL, s.l), max(maxP, s.p)
			}
			padded := float64(len(mb)) * flops[preset][sample{maxL, maxP}]
			if packed == 0 || padded == 0 {
				t.Fatalf("%s %v: golden samples missing", preset, mb)
			}
			for _, tc := range []struct {
				name      string
				got, want float64
			}{
				{"packed", m.MicroBatchCost(PackedFeatures(items), true).Total() / gflop, packed},
				{"padded", m.MicroBatchCost(PaddedFeatures(len(mb), maxL, maxP, 0), false).Total() / gflop, padded},
			} {
				if rel := math.Abs(tc.got-tc.want) / tc.want; rel > 1e-12 {
					t.Errorf("%s %s %v: Go %.4g FLOPs, trainer %.4g (%.2f%% apart)", preset, tc.name, mb, tc.got, tc.want, 100*rel)
				}
			}
		}
	}
}
