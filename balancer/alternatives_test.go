package balancer

import (
	"fmt"
	"slices"
	"testing"
)

// The candidates built concurrently (batches of parallelMinItems or more) give
// the plan the sequential build gives, for every placement, sync and pack.
func TestPartitionConcurrentMatchesSequential(t *testing.T) {
	items := genItems(parallelMinItems*2, genDynamic, 11)
	for _, pack := range []bool{false, true} {
		for _, pl := range []Placement{Colocated, Modality} {
			for _, sync := range []Sync{SyncMicroBatch, SyncStep} {
				t.Run(fmt.Sprintf("pack=%v/%v/sync=%v", pack, pl, sync), func(t *testing.T) {
					cfg := DefaultPartitionConfig()
					cfg.DP, cfg.MicroBatches, cfg.Pack, cfg.Placement, cfg.Sync = 16, 3, pack, pl, sync
					costs := cfg.model().Costs(items)
					var got [2]Assignment
					for i, seq := range []bool{false, true} {
						p, err := NewPartitioner(cfg)
						if err != nil {
							t.Fatal(err)
						}
						p.sequential = seq
						if got[i], err = p.Partition(items, costs); err != nil {
							t.Fatal(err)
						}
					}
					if !slices.EqualFunc(got[0].Members, got[1].Members, slices.Equal) {
						t.Errorf("concurrent plan differs from the sequential one")
					}
				})
			}
		}
	}
}
