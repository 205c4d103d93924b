package serve

import (
	"testing"

	"github.com/mmfeed/mmfeed/proto"
)

// The autoscaling gauges' step distance across epochs (readySteps, the
// rank hook): the steps from p to q, none when q is not after p.
func TestStepsBetween(t *testing.T) {
	steps := func(e int) int { return map[int]int{0: 10, 1: 7, 2: 5}[e] }
	for _, tc := range []struct {
		p, q proto.Pos
		want int
	}{
		{proto.Pos{Epoch: 0, Step: 3}, proto.Pos{Epoch: 0, Step: 8}, 5},
		{proto.Pos{Epoch: 0, Step: 8}, proto.Pos{Epoch: 1, Step: 2}, 4},
		{proto.Pos{Epoch: 0, Step: 8}, proto.Pos{Epoch: 2, Step: 1}, 10},
		{proto.Pos{Epoch: 1, Step: 2}, proto.Pos{Epoch: 0, Step: 8}, 0},
		{proto.Pos{Epoch: 1, Step: 2}, proto.Pos{Epoch: 1, Step: 2}, 0},
	} {
		if got := stepsBetween(tc.p, tc.q, steps); got != tc.want {
			t.Errorf("stepsBetween(%v, %v) = %d, want %d", tc.p, tc.q, got, tc.want)
		}
	}
}
