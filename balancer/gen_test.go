package balancer

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// genKind selects the image-token distribution of generated items.
type genKind int

const (
	genFixed   genKind = iota // P = 196 (224² at patch 16)
	genDynamic                // P = h·w with h, w uniform in [8, 32] → 64..1024
)

func (k genKind) String() string {
	if k == genDynamic {
		return "dynamic"
	}
	return "fixed"
}

// genItems returns n items with long-tailed text lengths: lognormal with median
// 24 tokens and σ 0.7, at least 3, capped at 128.
func genItems(n int, kind genKind, seed uint64) []Item {
	rng := rand.New(rand.NewPCG(seed, 0x6d6d66656564))
	items := make([]Item, n)
	for i := range items {
		l := int(math.Round(math.Exp(math.Log(24) + 0.7*rng.NormFloat64())))
		l = min(max(l, 3), 128)
		p := 196
		if kind == genDynamic {
			p = (8 + rng.IntN(25)) * (8 + rng.IntN(25))
		}
		items[i] = Item{ID: fmt.Sprintf("s%07d", i), TextTokens: l, ImageTokens: p, Complexity: rng.Float64()}
	}
	return items
}
