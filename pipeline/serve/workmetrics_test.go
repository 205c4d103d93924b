package serve

import "testing"

// The autoscaling gauges' step distance across epochs (readySteps, the
// rank hook): the steps from p to q, none when q is not after p.
func TestStepsBetween(t *testing.T) {
	steps := func(e int) int { return map[int]int{0: 10, 1: 7, 2: 5}[e] }
	for _, tc := range []struct {
		p, q pos
		want int
	}{
		{pos{0, 3}, pos{0, 8}, 5},
		{pos{0, 8}, pos{1, 2}, 4},
		{pos{0, 8}, pos{2, 1}, 10},
		{pos{1, 2}, pos{0, 8}, 0},
		{pos{1, 2}, pos{1, 2}, 0},
	} {
		if got := stepsBetween(tc.p, tc.q, steps); got != tc.want {
			t.Errorf("stepsBetween(%v, %v) = %d, want %d", tc.p, tc.q, got, tc.want)
		}
	}
}
