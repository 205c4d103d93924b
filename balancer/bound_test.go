package balancer

import (
	"fmt"
	"math"
	"testing"
)

func TestRankCostLowerBound(t *testing.T) {
	c := func(v ...float64) []Cost {
		out := make([]Cost, len(v))
		for i, x := range v {
			out[i] = Cost{Vision: x}
		}
		return out
	}
	tests := []struct {
		name  string
		costs []Cost
		dp    int
		pl    Placement
		want  float64
	}{
		{"mean", c(1, 1, 1, 1), 2, Colocated, 2},
		{"one heavy", c(10, 1, 1, 1), 2, Colocated, 10},
		{"dp+1 heavy share a rank", c(10, 10, 10, 1), 2, Colocated, 20},
		{"j=2", c(9, 9, 9, 9, 9, 0, 0, 0), 2, Colocated, 27},
		{"modality text side", []Cost{{Text: 4, Fusion: 1}, {Vision: 1, Text: 4}, {Text: 4}}, 3, Modality, 5},
		{"empty", nil, 4, Colocated, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RankCostLowerBound(tt.costs, tt.dp, tt.pl); math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// The bound is a bound: no plan, of any strategy, beats it.
func TestLowerBoundHolds(t *testing.T) {
	for _, kind := range []genKind{genFixed, genDynamic, genLumpy} {
		for _, pl := range []Placement{Colocated, Modality} {
			t.Run(fmt.Sprintf("%v/%v", kind, pl), func(t *testing.T) {
				items := genItems(128*12, kind, 5)
				for _, s := range Strategies() {
					cfg := DefaultConfig()
					cfg.Placement, cfg.Strategy = pl, s
					p, err := Build(items, cfg)
					if err != nil {
						t.Fatal(err)
					}
					for _, st := range p.Stats() {
						if st.ImbalanceLowerBound > st.Imbalance*(1+1e-12) {
							t.Fatalf("%v step %d: bound %v above imbalance %v", s, st.Step, st.ImbalanceLowerBound, st.Imbalance)
						}
					}
				}
			})
		}
	}
}
