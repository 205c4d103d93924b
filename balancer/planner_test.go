package balancer

import (
	"reflect"
	"testing"
)

// TestPlannerWindows plans window by window: the step count is known at
// Start, every window adds its steps without touching earlier ones, and the
// result is Build's plan byte for byte.
func TestPlannerWindows(t *testing.T) {
	base := DefaultConfig()
	base.Lookahead = 3
	tokens := base
	tokens.GlobalBatch, tokens.GlobalTokens = 0, 4000
	pad := base
	pad.Tail = TailPad
	random := base
	random.Strategy = StrategyRandom
	for _, tc := range []struct {
		name string
		cfg  Config
		n    int
	}{
		{"global batch", base, 128*10 + 40},
		{"global tokens", tokens, 3000},
		{"padded tail", pad, 128*7 + 40},
		{"random", random, 128*5 + 40},
		{"no steps", base, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items := genItems(tc.n, genDynamic, 7)
			want, err := Build(items, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			p, err := Start(items, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Steps(); got != len(want.Steps) {
				t.Fatalf("Steps() = %d before planning, Build has %d", got, len(want.Steps))
			}
			if p.Planned() != 0 {
				t.Fatalf("Start planned %d steps", p.Planned())
			}
			seen := []Step{}
			for w := range p.Windows() {
				start, size := p.Window(w)
				if start != p.Planned() {
					t.Fatalf("window %d starts at %d, %d planned", w, start, p.Planned())
				}
				more, err := p.PlanNext()
				if err != nil {
					t.Fatal(err)
				}
				if got := p.Planned(); got != start+size || more != (w+1 < p.Windows()) {
					t.Fatalf("window %d: planned %d (more %v), want %d", w, got, more, start+size)
				}
				if !reflect.DeepEqual(p.Plan().Steps[:len(seen)], seen) {
					t.Fatalf("window %d changed earlier steps", w)
				}
				seen = p.Plan().Steps
			}
			if !p.Done() {
				t.Fatal("not done after every window")
			}
			if got := p.Plan(); got.Hash() != want.Hash() || got.MaxDelay != want.MaxDelay || got.MinDelay != want.MinDelay {
				t.Errorf("incremental plan %.12s (delays %d..%d), Build %.12s (%d..%d)",
					got.Hash(), got.MinDelay, got.MaxDelay, want.Hash(), want.MinDelay, want.MaxDelay)
			}
		})
	}
}

// TestPlannerHash: the hash is known after the first window, stays the same
// to the end, repeats for the same inputs and changes with any of them.
func TestPlannerHash(t *testing.T) {
	cfg := DefaultConfig()
	items := genItems(128*9, genDynamic, 3)
	hashAfterFirst := func(items []Item, cfg Config) string {
		t.Helper()
		p, err := Start(items, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if p.Hash() != "" {
			t.Fatal("hash before the first window")
		}
		if _, err := p.PlanNext(); err != nil {
			t.Fatal(err)
		}
		return p.Hash()
	}
	want := hashAfterFirst(items, cfg)
	p, _ := Start(items, cfg)
	for more := true; more; {
		more, _ = p.PlanNext()
	}
	if p.Hash() != want || want == "" {
		t.Fatalf("hash after the plan %.12s, after the first window %.12s", p.Hash(), want)
	}
	changedItem := append([]Item(nil), items...)
	changedItem[len(items)-1].TextTokens++ // in the last window: only the input part sees it
	renamed := append([]Item(nil), items...)
	renamed[5].ID = "other"
	lookahead, dp, model := cfg, cfg, cfg
	lookahead.Lookahead = 2
	dp.DP = 4
	model.Model.Unit = "s"
	for _, tc := range []struct {
		name  string
		items []Item
		cfg   Config
	}{
		{"item features", changedItem, cfg},
		{"item id", renamed, cfg},
		{"lookahead", items, lookahead},
		{"dp", items, dp},
		{"model", items, model},
	} {
		if got := hashAfterFirst(tc.items, tc.cfg); got == want {
			t.Errorf("%s changed, hash did not", tc.name)
		}
	}
}
