package balancer

import (
	"errors"
	"slices"
	"testing"
)

func TestResizeRestOfEpoch(t *testing.T) {
	items := genItems(64*8, genDynamic, 12)
	cfg := DefaultConfig()
	cfg.DP, cfg.MicroBatches, cfg.GlobalBatch = 4, 2, 64
	p, err := Build(items, cfg)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		from, dp int
	}{
		{"4to2 mid", 3, 2},
		{"4to8 mid", 3, 8},
		{"4to1 start", 0, 1},
		{"4to2 last step", len(p.Steps) - 1, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q, err := p.Resize(tc.from, tc.dp)
			if err != nil {
				t.Fatal(err)
			}
			if q.Config.DP != tc.dp || p.Config.DP != 4 {
				t.Fatalf("dp: got %d (original %d), want %d (original 4)", q.Config.DP, p.Config.DP, tc.dp)
			}
			for k, s := range q.Steps {
				want := tc.dp
				if k < tc.from {
					want = 4
				}
				if s.Index != k || len(s.Ranks) != want {
					t.Fatalf("step %d: index %d, %d ranks, want index %d, %d ranks", k, s.Index, len(s.Ranks), k, want)
				}
				for r, rank := range s.Ranks {
					if len(rank) != cfg.MicroBatches {
						t.Fatalf("step %d rank %d: %d micro-batches, want %d", k, r, len(rank), cfg.MicroBatches)
					}
				}
			}
			got := append(realItems(q.Steps), q.Dropped...)
			slices.Sort(got)
			want := append(realItems(p.Steps), p.Dropped...)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("the resized plan holds %d real samples + dropped, the original %d", len(got), len(want))
			}
			if a, b := realItems(q.Steps[:tc.from]), realItems(p.Steps[:tc.from]); !slices.Equal(a, b) {
				t.Errorf("steps before %d changed", tc.from)
			}
			again, err := p.Resize(tc.from, tc.dp)
			if err != nil || again.Hash() != q.Hash() {
				t.Errorf("Resize is not deterministic (err %v)", err)
			}
		})
	}
	if _, err := p.Resize(len(p.Steps), 2); !errors.Is(err, ErrReplan) {
		t.Errorf("resize past the end: err %v, want ErrReplan", err)
	}
}
