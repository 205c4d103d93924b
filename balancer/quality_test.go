package balancer

import (
	"fmt"
	"testing"
)

// The quality targets on long-tailed text lengths: dp 8, global batch
// 128, fixed and dynamic image tokens, both placements.
func TestQualityTargets(t *testing.T) {
	for _, kind := range []genKind{genFixed, genDynamic} {
		for _, pl := range []Placement{Colocated, Modality} {
			for _, shape := range []ModelShape{TinyShape(), BaseShape()} {
				t.Run(fmt.Sprintf("%v/%v/%s", kind, pl, shape.Name), func(t *testing.T) {
					cfg := DefaultConfig()
					cfg.Placement = pl
					cfg.Model, _ = NewCostModel(shape)
					items := genItems(128*150, kind, 2024)
					r, err := Compare(items, cfg)
					if err != nil {
						t.Fatal(err)
					}
					mm, rnd := r.Strategies["mmfeed"], r.Strategies["random"]
					if mm.ImbalanceP50 > 1.01 {
						t.Errorf("imbalance p50 %.4f > 1.01", mm.ImbalanceP50)
					}
					if mm.ImbalanceP99 > 1.03 {
						t.Errorf("imbalance p99 %.4f > 1.03", mm.ImbalanceP99)
					}
					if mm.PaddingEfficiency < 0.95 {
						t.Errorf("padding efficiency %.4f < 0.95", mm.PaddingEfficiency)
					}
					if mm.StepCostSum >= rnd.StepCostSum {
						t.Errorf("mmfeed step cost %v ≥ random %v", mm.StepCostSum, rnd.StepCostSum)
					}
					if mm.ImbalanceP99 >= rnd.ImbalanceP99 {
						t.Errorf("mmfeed p99 %v ≥ random p99 %v", mm.ImbalanceP99, rnd.ImbalanceP99)
					}
				})
			}
		}
	}
}
