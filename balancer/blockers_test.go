package balancer

import (
	"slices"
	"strings"
	"testing"
)

// TestBlockersNameTheCostliestSample: without lookahead, heavy-tailed steps
// have bounds above the target; each blocker names its step's costliest
// sample, a --sync step fix that does not raise the bound, and the report
// prints them. With the window, no step is blocked.
func TestBlockersNameTheCostliestSample(t *testing.T) {
	items := heavyTailItems(64*64, 9)
	cfg := DefaultConfig()
	cfg.DP, cfg.GlobalBatch, cfg.MicroBatches, cfg.Pack, cfg.Lookahead = 16, 256, 4, true, 1
	p, err := Build(items, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stats := p.Stats()
	bs := p.Blockers(stats, 100)
	if len(bs) == 0 {
		t.Fatal("no blockers at lookahead 1")
	}
	for i, b := range bs {
		if b.Bound <= ImbalanceTarget || (i > 0 && b.Bound > bs[i-1].Bound) {
			t.Fatalf("blocker %d bound %.4f (previous %.4f)", i, b.Bound, bs[max(i-1, 0)].Bound)
		}
		k := b.Step - p.Steps[0].Index
		for _, r := range p.Steps[k].Ranks {
			for _, mb := range r {
				for _, e := range mb {
					if p.ItemCost(e.Item) > p.ItemCost(b.Item) {
						t.Fatalf("step %d: %q is costlier than the blocker's %q", b.Step, items[e.Item].ID, b.ID)
					}
				}
			}
		}
		i := slices.IndexFunc(b.Fixes, func(f Fix) bool { return f.Setting == "--sync step" })
		if i < 0 || b.Fixes[i].Bound > b.Bound || b.Fixes[i].Bound < 1 {
			t.Fatalf("step %d (bound %.4f): fixes %+v", b.Step, b.Bound, b.Fixes)
		}
	}
	r, err := NewReport(p)
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	if err := r.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sb.String(), "steps no split can bring within") || !strings.Contains(sb.String(), bs[0].ID) {
		t.Fatalf("report does not list the blockers:\n%s", sb.String())
	}
	cfg.Lookahead = 4
	if p, err = Build(items, cfg); err != nil {
		t.Fatal(err)
	}
	if bs := p.Blockers(p.Stats(), 100); len(bs) != 0 {
		t.Fatalf("lookahead 4: %d blockers, first %v", len(bs), bs[0])
	}
}
