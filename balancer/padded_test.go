package balancer

import (
	"fmt"
	"math"
	"testing"
)

func TestPaddedFeatures(t *testing.T) {
	for _, tc := range []struct {
		items []Item
		want  Features
	}{
		{[]Item{{TextTokens: 4, ImageTokens: 9, Complexity: 0.5}}, FeaturesOf(4, 9, 0.5)},
		// Two samples padded to L 10 and P 20 each; complexity stays their own.
		{[]Item{{TextTokens: 10, ImageTokens: 5, Complexity: 0.25}, {TextTokens: 3, ImageTokens: 20, Complexity: 0.5}},
			Features{20, 200, 40, 800, 400, 0.75, 2}},
	} {
		var s mbShape
		for _, it := range tc.items {
			s.add(it)
		}
		if got := s.features(); got != tc.want {
			t.Errorf("padded features of %+v = %v, want %v", tc.items, got, tc.want)
		}
		if got := PaddedFeatures(s.count, s.maxL, s.maxP, s.complexity); got != tc.want {
			t.Errorf("PaddedFeatures = %v, want %v", got, tc.want)
		}
	}
}

// A plan's rank costs are the model's cost of its padded rank features, at
// least the unpadded cost, and equal to it when every micro-batch holds
// samples of one shape.
func TestStatsArePadded(t *testing.T) {
	for _, kind := range []genKind{genFixed, genDynamic} {
		for _, s := range Strategies() {
			t.Run(fmt.Sprintf("%v/%v", kind, s), func(t *testing.T) {
				cfg := DefaultConfig()
				cfg.Strategy, cfg.DP, cfg.MicroBatches, cfg.GlobalBatch = s, 4, 2, 32
				items := genItems(256, kind, 5)
				p, err := Build(items, cfg)
				if err != nil {
					t.Fatal(err)
				}
				m := cfg.model()
				for k, st := range p.Stats() {
					step := p.Steps[k]
					for r, f := range p.RankFeatures(step) {
						got, want := st.RankCost[r], cfg.Placement.StepCost(m.CostOf(f))
						if math.Abs(got-want) > 1e-9*want {
							t.Fatalf("step %d rank %d: cost %v, want padded %v", k, r, got, want)
						}
						var own Cost
						for _, mb := range step.Ranks[r] {
							for _, e := range mb {
								own = own.Add(m.Cost(items[e.Item]))
							}
						}
						if unpadded := cfg.Placement.StepCost(own); got < unpadded*(1-1e-12) {
							t.Fatalf("step %d rank %d: padded cost %v < unpadded %v", k, r, got, unpadded)
						}
					}
					if e := st.ComputeEfficiency(); !(e > 0 && e <= 1+1e-12) {
						t.Fatalf("step %d: compute efficiency %v outside (0, 1]", k, e)
					}
				}
			})
		}
	}
	uniform := make([]Item, 16)
	for i := range uniform {
		uniform[i] = Item{ID: fmt.Sprint(i), TextTokens: 7, ImageTokens: 196, Complexity: 0.5}
	}
	cfg := DefaultConfig()
	cfg.DP, cfg.MicroBatches, cfg.GlobalBatch = 2, 2, 16
	p, err := Build(uniform, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sm := Summarize(p.Stats())
	if math.Abs(sm.ComputeEfficiency-1) > 1e-12 || sm.PaddingEfficiency != 1 {
		t.Errorf("one shape: compute efficiency %v, padding %v, want 1, 1", sm.ComputeEfficiency, sm.PaddingEfficiency)
	}
}
