package balancer

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fingerprintCase is one Partition call of TestPartitionFingerprints.
type fingerprintCase struct {
	n    int
	kind genKind
	cfg  PartitionConfig
}

func (c fingerprintCase) String() string {
	return fmt.Sprintf("n=%d %v dp=%d m=%d sync=%v pl=%v pp=%d pack=%v budget=%+v",
		c.n, c.kind, c.cfg.DP, c.cfg.MicroBatches, c.cfg.Sync, c.cfg.Placement, c.cfg.PP, c.cfg.Pack, c.cfg.Budget)
}

// fingerprintCases draws a fixed matrix of layouts: sizes from a few items
// per micro-batch to the bench's 4,096 on 64 ranks, both syncs and
// placements, budgets, pipeline stages, padded and packed.
func fingerprintCases() []fingerprintCase {
	rng := rand.New(rand.NewPCG(11, 12))
	var out []fingerprintCase
	for _, n := range []int{24, 64, 128, 256, 512, 1024, 4096} {
		for range 6 {
			cfg := DefaultPartitionConfig()
			cfg.DP = []int{1, 2, 4, 8, 16, 64}[rng.IntN(6)]
			cfg.MicroBatches = []int{1, 2, 2, 4}[rng.IntN(4)]
			for cfg.DP*cfg.MicroBatches*2 > n {
				cfg.DP = max(cfg.DP/2, 1)
				if cfg.DP == 1 {
					cfg.MicroBatches = 1
				}
			}
			cfg.Sync = Sync(rng.IntN(2))
			cfg.Placement = Placement(rng.IntN(2))
			if rng.IntN(4) == 0 {
				cfg.PP = 4
			}
			if rng.IntN(5) == 0 {
				cfg.Pack = true
			}
			if rng.IntN(3) == 0 {
				per := 3*n/(cfg.DP*cfg.MicroBatches) + 1 // room for about 3× a fair share
				cfg.Budget = Budget{MaxPaddedTokens: 128 * per, MaxImageTokens: 1024 * per, MaxTokens: 1152 * per}
			}
			out = append(out, fingerprintCase{n, genKind(rng.IntN(3)), cfg})
		}
	}
	bench := DefaultPartitionConfig()
	bench.DP, bench.MicroBatches = 64, 2
	return append(out, fingerprintCase{4096, genDynamic, bench})
}

// TestPartitionFingerprints pins Partition's assignments over
// fingerprintCases by their SHA-256 and step cost
// (testdata/partition_fingerprints.txt; refresh with -update). A change is
// deliberate only when the plans it changes are no worse (the step costs
// show it; explain it in the commit).
func TestPartitionFingerprints(t *testing.T) {
	if testing.Short() {
		t.Skip("partitions 4,096 items several times")
	}
	var b strings.Builder
	for i, c := range fingerprintCases() {
		items := genItems(c.n, c.kind, uint64(100+i))
		p, err := NewPartitioner(c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		costs := c.cfg.model().Costs(items)
		a, err := p.Partition(items, costs)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", c, err)
			continue
		}
		h := sha256.New()
		for _, mb := range a.Members {
			binary.Write(h, binary.LittleEndian, int32(len(mb)))
			binary.Write(h, binary.LittleEndian, mb)
		}
		fmt.Fprintf(&b, "%s: %x step %.6g\n", c, h.Sum(nil)[:8], fingerprintStep(p, items, costs, a))
	}
	golden := filepath.Join("testdata", "partition_fingerprints.txt")
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Errorf("got  %s\nwant %s", gl[i], wl[i])
			}
		}
		t.Fatalf("partitions differ from %s (run with -update if intended)", golden)
	}
}

// fingerprintStep returns the step cost Partition minimises for a: the
// padded or packed objective under the configured sync and pipeline stages.
func fingerprintStep(p *Partitioner, items []Item, costs []Cost, a Assignment) float64 {
	slots := make([][]float64, a.DP)
	for r := range slots {
		for m := range a.MicroBatches {
			var s mbShape
			var c Cost
			for _, pos := range a.MicroBatch(r, m) {
				s.add(items[pos])
				c = c.Add(costs[pos])
			}
			if !p.cfg.Pack {
				c = p.model.CostOf(s.features())
			}
			slots[r] = append(slots[r], p.cfg.Placement.StepCost(c))
		}
		sortDesc(slots[r])
	}
	return PipelineStepCost(slots, p.cfg.pp(), p.cfg.Sync)
}
