package report

import (
	"math"
	"testing"

	"github.com/mmfeed/mmfeed/proto"
)

// TestRunRecord feeds the record directly: a step counts once every rank
// reported it (a dp rank's time is its slowest mp rank's), a repeat or an
// invalid time changes nothing, and a step this service did not publish is
// not measured.
func TestRunRecord(t *testing.T) {
	fb := func(step, dp, mp int, sec float64) proto.Feedback {
		return proto.Feedback{Epoch: 0, Step: step, DPRank: dp, MPRank: mp, ComputeSeconds: sec, DataWaitSeconds: 0.01}
	}
	tests := []struct {
		name      string
		feedback  []proto.Feedback
		measured  int
		imbalance float64 // measured mean (0: none)
		rank0     float64 // rank 0's mean seconds
		open0     bool    // step 0 still waits for some rank's times (unmeasured)
	}{
		{"every rank", []proto.Feedback{fb(0, 0, 0, 1), fb(0, 0, 1, 2), fb(0, 1, 0, 1), fb(0, 1, 1, 1)}, 1, 4.0 / 3, 2, false},
		{"one mp rank missing", []proto.Feedback{fb(0, 0, 0, 1), fb(0, 0, 1, 2), fb(0, 1, 0, 1)}, 0, 0, 0, true},
		{"repeat counts once", []proto.Feedback{fb(0, 0, 0, 1), fb(0, 0, 0, 1), fb(0, 0, 1, 1), fb(0, 1, 0, 1)}, 0, 0, 0, true},
		{"NaN ignored", []proto.Feedback{fb(0, 0, 0, math.NaN()), fb(0, 0, 1, 1), fb(0, 1, 0, 1), fb(0, 1, 1, 1)}, 0, 0, 0, true},
		{"negative ignored", []proto.Feedback{fb(0, 0, 0, -1), fb(0, 0, 1, 1), fb(0, 1, 0, 1), fb(0, 1, 1, 1)}, 0, 0, 0, true},
		{"unpublished step", []proto.Feedback{fb(7, 0, 0, 1), fb(7, 0, 1, 1), fb(7, 1, 0, 1), fb(7, 1, 1, 1)}, 0, 0, 0, true},
		{"rank outside the layout", []proto.Feedback{fb(0, 2, 0, 1), fb(0, 0, 2, 1)}, 0, 0, 0, true},
		{"two steps", []proto.Feedback{fb(0, 0, 0, 3), fb(0, 0, 1, 3), fb(0, 1, 0, 1), fb(0, 1, 1, 1),
			fb(1, 0, 0, 1), fb(1, 0, 1, 1), fb(1, 1, 0, 1), fb(1, 1, 1, 1)}, 2, (1.5 + 1) / 2, 2, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRunRecord(2, 2)
			r.published(0, 0, []float64{1, 3})
			r.published(0, 1, []float64{1, 1})
			r.published(0, 0, []float64{9, 9}) // a republication keeps the first prediction
			for _, f := range tc.feedback {
				r.measured(f)
			}
			e0, s1, e1 := proto.Pos{}, proto.Pos{Step: 1}, proto.Pos{Epoch: 1}
			if got := r.unmeasured(e0, s1); got != tc.open0 {
				t.Errorf("step 0 unmeasured %v, want %v", got, tc.open0)
			}
			if got, want := r.unmeasured(e0, e1), tc.measured < 2; got != want {
				t.Errorf("epoch 0 unmeasured %v, want %v", got, want)
			}
			if r.unmeasured(e1, proto.Pos{Epoch: 2}) {
				t.Error("epoch 1 unmeasured, want nothing published there")
			}
			sum := r.summary()
			if len(sum) != 1 {
				t.Fatalf("got %d epochs, want 1", len(sum))
			}
			em := sum[0]
			if em.StepsPublished != 2 || em.PlannedImbalance.Steps != 2 || math.Abs(em.PlannedImbalance.Max-1.5) > 1e-12 {
				t.Errorf("published %d, planned %+v; want 2 steps, max 1.5", em.StepsPublished, em.PlannedImbalance)
			}
			if em.StepsMeasured != tc.measured || math.Abs(em.MeasuredImbalance.Mean-tc.imbalance) > 1e-12 || math.Abs(em.Ranks[0].MeanSeconds-tc.rank0) > 1e-12 {
				t.Errorf("measured %d steps at mean imbalance %v, rank 0 %v s; want %d, %v, %v", em.StepsMeasured, em.MeasuredImbalance.Mean, em.Ranks[0].MeanSeconds, tc.measured, tc.imbalance, tc.rank0)
			}
			if tc.measured > 0 && em.PredictedImbalance.Steps != tc.measured {
				t.Errorf("predicted imbalance over %d steps, want the %d measured", em.PredictedImbalance.Steps, tc.measured)
			}
		})
	}
}
