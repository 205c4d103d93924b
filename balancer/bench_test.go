package balancer

import (
	"fmt"
	"io"
	"testing"
)

func BenchmarkBuild(b *testing.B) {
	for _, n := range []int{16384, 131072} {
		for _, s := range Strategies() {
			b.Run(fmt.Sprintf("strategy=%v/samples=%d", s, n), func(b *testing.B) {
				items := genItems(n, genDynamic, 1)
				cfg := DefaultConfig()
				cfg.Strategy = s
				b.ReportAllocs()
				for b.Loop() {
					p, err := Build(items, cfg)
					if err != nil {
						b.Fatal(err)
					}
					if err := p.WriteJSONL(io.Discard); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "samples/s")
			})
		}
	}
}
