package balancer

import (
	"fmt"
	"testing"
)

// On small layouts (dp 2, global batch 32) a padding-constrained grouping can
// segregate the long captions onto one rank; under the padded objective
// mmfeed must still predict a step time no worse than random's or
// length_grouped's on the same items, for every micro-batch count, placement
// and image-token distribution.
func TestSmallLayoutsNotWorseThanBaselines(t *testing.T) {
	for _, kind := range []genKind{genFixed, genDynamic, genLumpy} {
		for _, pl := range []Placement{Colocated, Modality} {
			for _, mbs := range []int{1, 2, 4} {
				for _, la := range []int{1, 4} {
					name := fmt.Sprintf("%v/%v/mb=%d/lookahead=%d", kind, pl, mbs, la)
					t.Run(name, func(t *testing.T) {
						cfg := DefaultConfig()
						cfg.DP, cfg.GlobalBatch, cfg.MicroBatches, cfg.Placement, cfg.Lookahead = 2, 32, mbs, pl, la
						r, err := Compare(genItems(576, kind, 7), cfg)
						if err != nil {
							t.Fatal(err)
						}
						mm := r.Strategies["mmfeed"]
						for _, base := range []string{"random", "length_grouped"} {
							if b := r.Strategies[base]; mm.StepCostSum > b.StepCostSum {
								t.Errorf("mmfeed step cost sum %.6g > %s %.6g (imbalance p50 %.4f vs %.4f)",
									mm.StepCostSum, base, b.StepCostSum, mm.ImbalanceP50, b.ImbalanceP50)
							}
						}
					})
				}
			}
		}
	}
}

// With one global batch per window (no redeal), every step's padded max rank
// cost is at most the random split's of the same samples: random's split is
// one of the partitioner's candidates.
func TestPartitionNotWorseThanRandomSplit(t *testing.T) {
	model, _ := NewCostModel(BaseShape())
	for _, kind := range []genKind{genFixed, genDynamic, genLumpy} {
		for _, pl := range []Placement{Colocated, Modality} {
			for _, mbs := range []int{1, 2, 4} {
				t.Run(fmt.Sprintf("%v/%v/mb=%d", kind, pl, mbs), func(t *testing.T) {
					cfg := PartitionConfig{DP: 2, MicroBatches: mbs, PaddingTarget: 0.95, Placement: pl, Model: model}
					p, err := NewPartitioner(cfg)
					if err != nil {
						t.Fatal(err)
					}
					for s := range 8 {
						items := genItems(32, kind, uint64(s))
						costs := model.Costs(items)
						a, err := p.Partition(items, costs)
						if err != nil {
							t.Fatal(err)
						}
						checkAssignment(t, items, costs, cfg, a)
						rnd := Assignment{DP: 2, MicroBatches: mbs, Members: p.randomSplitOf(items)}
						if got, want := paddedMax(model, items, pl, a), paddedMax(model, items, pl, rnd); got > want*(1+1e-12) {
							t.Errorf("seed %d: padded max %v > random split's %v", s, got, want)
						}
					}
				})
			}
		}
	}
}

// randomSplitOf returns randomSplit of items without the budget check.
func (p *Partitioner) randomSplitOf(items []Item) [][]int32 {
	unlimited := *p
	unlimited.cfg.Budget = Budget{}
	return unlimited.newJob(items, unlimited.cfg.model().Costs(items)).randomSplit()
}
