package balancer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"
)

// benchPartitionItems are bench/plan.go's benchPartition items: 4,096 samples,
// long-tailed captions, dynamic-resolution image tokens.
func benchPartitionItems() []Item {
	rng := rand.New(rand.NewPCG(1, 2))
	items := make([]Item, 4096)
	for i := range items {
		items[i] = Item{
			ID:          fmt.Sprint(i),
			TextTokens:  min(128, 4+int(math.Exp(rng.NormFloat64()*0.9+3))),
			ImageTokens: 64 + rng.IntN(960),
			Complexity:  rng.Float64(),
		}
	}
	return items
}

// BenchmarkPartition4096On64 is the make bench key partition_4096_on_64_ranks_ms
// (padded) and its packed counterpart. cpu-ms/op is the process's CPU time
// per partition (every thread, GC included), like the _cpu_ms keys: on a
// loaded machine it is the figure to compare (run with -cpu 1).
func BenchmarkPartition4096On64(b *testing.B) {
	items := benchPartitionItems()
	for _, pack := range []bool{false, true} {
		b.Run(fmt.Sprintf("pack=%v", pack), func(b *testing.B) {
			cfg := DefaultPartitionConfig()
			cfg.DP, cfg.MicroBatches, cfg.Pack = 64, 2, pack
			p, err := NewPartitioner(cfg)
			if err != nil {
				b.Fatal(err)
			}
			costs := cfg.model().Costs(items)
			c0 := processCPU()
			for b.Loop() {
				if _, err := p.Partition(items, costs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((processCPU()-c0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}

// processCPU returns the process's user + system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
