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
	genLumpy                  // the real corpus's hard parts, see genLumpyItem
)

func (k genKind) String() string {
	switch k {
	case genDynamic:
		return "dynamic"
	case genLumpy:
		return "lumpy"
	}
	return "fixed"
}

// genItems returns n items with long-tailed text lengths: lognormal with median
// 24 tokens and σ 0.7, at least 3, capped at 128.
func genItems(n int, kind genKind, seed uint64) []Item {
	rng := rand.New(rand.NewPCG(seed, 0x6d6d66656564))
	items := make([]Item, n)
	if kind == genLumpy {
		for i := range items {
			items[i] = genLumpyItem(rng, fmt.Sprintf("s%07d", i))
		}
		return items
	}
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

// genLumpyItem draws one item like the Debian corpus under dynamic resolution
// (testdata/items_lumpy.csv is 4,352 of them): captions are package
// descriptions, 31% of 3–6 tokens and 10% cut at the 128-token cap; images
// run from 16-px icons (P 14–63, and 31% exactly 64) to 4K wallpapers, 13%
// of them at 3,036–3,872 tokens, each then costing about half a rank's share
// of a step at dp 8 and global batch 128.
func genLumpyItem(rng *rand.Rand, id string) Item {
	var l int
	switch u := rng.Float64(); {
	case u < 0.31:
		l = 3 + rng.IntN(4)
	case u < 0.545:
		l = 7 + rng.IntN(13)
	case u < 0.68:
		l = 20 + rng.IntN(40)
	case u < 0.903:
		l = 60 + rng.IntN(68)
	default:
		l = 128
	}
	var p int
	switch v := rng.Float64(); {
	case v < 0.22:
		p = 14 + rng.IntN(50)
	case v < 0.53:
		p = 64
	case v < 0.75:
		p = 65 + rng.IntN(355)
	case v < 0.874:
		p = int(420 * math.Exp(rng.Float64()*math.Log(3000.0/420)))
	case v < 0.915:
		p = []int{3036, 3500}[rng.IntN(2)]
	default:
		p = 3872
	}
	return Item{ID: id, TextTokens: l, ImageTokens: p, Complexity: rng.Float64()}
}
