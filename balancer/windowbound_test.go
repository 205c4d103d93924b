package balancer

import (
	"fmt"
	"testing"
)

// TestWindowLowerBoundHolds: for every layout, the window bound is positive
// and no more than the mmfeed plan's Σ step cost, and with lookahead 1 (a
// window is a step) it is no more than the per-step bound of any step's
// samples.
func TestWindowLowerBoundHolds(t *testing.T) {
	type layout struct {
		kind      genKind
		dp, mb    int
		batch, la int
		pack      bool
		sync      Sync
		pl        Placement
		tail      Tail
	}
	var cases []layout
	for _, kind := range []genKind{genFixed, genDynamic, genLumpy} {
		for _, pack := range []bool{false, true} {
			for _, sync := range []Sync{SyncMicroBatch, SyncStep} {
				cases = append(cases, layout{kind, 8, 4, 128, 4, pack, sync, Colocated, TailDrop})
			}
		}
		cases = append(cases, layout{kind, 4, 2, 40, 3, true, SyncMicroBatch, Modality, TailPad},
			layout{kind, 8, 2, 64, 1, false, SyncMicroBatch, Colocated, TailDrop})
	}
	for _, l := range cases {
		t.Run(fmt.Sprintf("%v/dp%d/mb%d/la%d/pack%v/%v/%v/%v", l.kind, l.dp, l.mb, l.la, l.pack, l.sync, l.pl, l.tail), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DP, cfg.MicroBatches, cfg.GlobalBatch, cfg.Lookahead = l.dp, l.mb, l.batch, l.la
			cfg.Pack, cfg.Sync, cfg.Placement, cfg.Tail = l.pack, l.sync, l.pl, l.tail
			p, err := Build(genItems(1000, l.kind, 5), cfg)
			if err != nil {
				t.Fatal(err)
			}
			sum := Summarize(p.Stats())
			wb := p.WindowLowerBoundSum()
			if wb <= 0 || wb > sum.StepCostSum*(1+1e-9) {
				t.Fatalf("window bound %.6g, plan's step cost sum %.6g", wb, sum.StepCostSum)
			}
			if l.la == 1 && wb > sum.CostLowerBoundSum*(1+1e-9) {
				t.Fatalf("lookahead 1: window bound %.6g above the steps' bound %.6g", wb, sum.CostLowerBoundSum)
			}
		})
	}
}
