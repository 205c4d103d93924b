package balancer

import (
	"errors"
	"slices"
	"testing"
)

// Replan keeps the prefix, replans the suffix's real samples under the new
// model with the same step count, and leaves the original plan alone.
func TestReplanSuffix(t *testing.T) {
	items := genItems(64*8, genDynamic, 11)
	cfg := DefaultConfig()
	cfg.DP, cfg.MicroBatches, cfg.GlobalBatch = 4, 2, 64
	p, err := Build(items, cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkPlan(t, items, p)
	model := cfg.Model
	model.Coef[Text][FeatL2] = 50*model.Coef[Text][FeatL2] + 1e-3 // text much dearer than planned
	for _, from := range []int{0, 3, len(p.Steps) - 1} {
		before := realItems(p.Steps)
		q, err := p.Replan(from, model)
		if err != nil {
			t.Fatalf("from %d: %v", from, err)
		}
		checkPlan(t, items, q)
		if len(q.Steps) != len(p.Steps) {
			t.Fatalf("from %d: %d steps, want %d", from, len(q.Steps), len(p.Steps))
		}
		for k := range from {
			if !slices.EqualFunc(q.Steps[k].Ranks, p.Steps[k].Ranks, func(a, b []MicroBatch) bool {
				return slices.EqualFunc(a, b, func(x, y MicroBatch) bool { return slices.Equal(x, y) })
			}) {
				t.Fatalf("from %d: step %d changed", from, k)
			}
		}
		for k, s := range q.Steps {
			if s.Index != k {
				t.Fatalf("from %d: step %d has index %d", from, k, s.Index)
			}
		}
		if got, want := realItems(q.Steps[from:]), realItems(p.Steps[from:]); !slices.Equal(got, want) {
			t.Errorf("from %d: suffix samples differ", from)
		}
		if !slices.Equal(realItems(p.Steps), before) {
			t.Errorf("from %d: Replan changed the original plan", from)
		}
	}
	if _, err := p.Replan(len(p.Steps), model); !errors.Is(err, ErrReplan) {
		t.Errorf("replan past the end: %v, want ErrReplan", err)
	}
}

// realItems returns the sorted real (weight > 0) items of steps.
func realItems(steps []Step) []int32 {
	var out []int32
	for _, s := range steps {
		for _, rank := range s.Ranks {
			for _, mb := range rank {
				for _, e := range mb {
					if e.Weight > 0 {
						out = append(out, e.Item)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out
}
