package balancer

// The bundled trainer pads every micro-batch to a rectangle: input_ids to the
// micro-batch's longest L, the vision tokens to its most patches (P_max under
// dynamic resolution, each image's own grid first in its row, whatever the
// aspect ratios; fixed-size images all have the same P). A micro-batch
// of n samples therefore computes about n × cost(L_max, P_max): every entry's
// vision part at P_max, its text part at L_max and its fusion part at
// L_max·P_max. The decode term (complexity) is the loader's, per real image,
// and is not padded. docs/cost-model.md, "Padding".

// PaddedFeatures returns the feature sum a micro-batch of count entries costs
// once padded: count × [L, L², P, P², L·P] at its longest text maxText and
// largest image maxImage, the entries' own complexity sum, and count.
func PaddedFeatures(count, maxText, maxImage int, complexity float64) Features {
	n, l, p := float64(count), float64(maxText), float64(maxImage)
	return Features{n * l, n * l * l, n * p, n * p * p, n * l * p, complexity, n}
}

// mbShape accumulates what PaddedFeatures needs of a micro-batch.
type mbShape struct {
	count, maxL, maxP int
	complexity        float64
	sumP              int // Σ P, for the budget
}

func (s *mbShape) add(it Item) {
	s.sumP += it.ImageTokens
	s.count++
	s.maxL = max(s.maxL, it.TextTokens)
	s.maxP = max(s.maxP, it.ImageTokens)
	s.complexity += it.Complexity
}

func (s mbShape) features() Features {
	return PaddedFeatures(s.count, s.maxL, s.maxP, s.complexity)
}

// PackedFeatures returns the feature sum a packed micro-batch costs: the sum
// of its entries' own features (each sample attends only within itself, so
// no padding term). The model's MicroBatchOverhead comes on top
// (CostModel.MicroBatchCost).
func PackedFeatures(items []Item) Features {
	var f Features
	for _, it := range items {
		f = f.Add(FeaturesOf(it.TextTokens, it.ImageTokens, it.Complexity))
	}
	return f
}

// MicroBatchCost returns what a micro-batch of features f costs: f's cost,
// plus MicroBatchOverhead when packed.
func (m CostModel) MicroBatchCost(f Features, packed bool) Cost {
	c := m.CostOf(f)
	if packed {
		c = c.Add(m.MicroBatchOverhead)
	}
	return c
}

// MicroBatchFeatures returns the feature sum of micro-batch mb of p as the
// trainer computes it (padding entries included): padded (PaddedFeatures),
// or with Config.Pack the sum of the entries' own features.
func (p *Plan) MicroBatchFeatures(mb MicroBatch) Features {
	if p.Config.Pack {
		var f Features
		for _, e := range mb {
			it := p.items[e.Item]
			f = f.Add(FeaturesOf(it.TextTokens, it.ImageTokens, it.Complexity))
		}
		return f
	}
	var s mbShape
	for _, e := range mb {
		s.add(p.items[e.Item])
	}
	return s.features()
}

// RankFeatures returns each dp rank's (padded or packed) feature sum over step s: the sum
// over the rank's micro-batches of MicroBatchFeatures. Its cost under the
// plan's model is the rank's step cost in Stats, so calibration observations
// built from it describe the work the trainer measured.
func (p *Plan) RankFeatures(s Step) []Features {
	out := make([]Features, len(s.Ranks))
	for r, rank := range s.Ranks {
		for _, mb := range rank {
			out[r] = out[r].Add(p.MicroBatchFeatures(mb))
		}
	}
	return out
}

// paddedCost returns the padded cost vector of the micro-batch of items at
// positions members.
func paddedCost(m CostModel, items []Item, members []int32) Cost {
	var s mbShape
	for _, pos := range members {
		s.add(items[pos])
	}
	return m.CostOf(s.features())
}
