package balancer

import (
	"cmp"
	"math"
	"slices"
)

// Histogram counts values in equal-width bins over [Lo, Hi].
type Histogram struct {
	Lo     float64 `json:"lo"`
	Hi     float64 `json:"hi"`
	Counts []int   `json:"counts"`
	Mean   float64 `json:"mean"`
	P50    float64 `json:"p50"`
	P99    float64 `json:"p99"`
	Max    float64 `json:"max"`
}

// HistogramBins is the bin count of the report's histograms.
const HistogramBins = 30

// NewHistogram bins values (non-finite ones are skipped) into bins equal bins
// between their minimum and maximum.
func NewHistogram(values []float64, bins int) Histogram {
	v := finiteSorted(values)
	h := Histogram{Counts: make([]int, max(bins, 1))}
	if len(v) == 0 {
		return h
	}
	h.Lo, h.Hi = v[0], v[len(v)-1]
	h.Mean, h.P50, h.P99, h.Max = meanOf(v), quantileOf(v, 0.5), quantileOf(v, 0.99), h.Hi
	width := (h.Hi - h.Lo) / float64(len(h.Counts))
	for _, x := range v {
		b := 0
		if width > 0 {
			b = min(int((x-h.Lo)/width), len(h.Counts)-1)
		}
		h.Counts[b]++
	}
	return h
}

// QuarantineGroup is one quarantine reason in a report.
type QuarantineGroup struct {
	Count int64 `json:"count"`
	// Examples holds the first few sample ids (or locations when a sample
	// had no id) rejected for the reason.
	Examples []string `json:"examples"`
}

// KeptColumn is one source field the batches carry (--keep), in a report.
type KeptColumn struct {
	Name string `json:"name"`
	Type string `json:"type"` // utf8, int64 or float64
	// Missing counts the indexed samples that lack the field (null values).
	Missing int64 `json:"missing"`
}

// Thumbnail is a small picture of one sample, with what it costs. The
// balancer never decodes images: the caller (the pipeline) makes the bytes.
type Thumbnail struct {
	// Kind says why the sample is shown: "heaviest" or "aspect".
	Kind        string  `json:"kind"`
	ID          string  `json:"id"`
	Width       int     `json:"width"`
	Height      int     `json:"height"`
	TextTokens  int     `json:"text_tokens"`
	ImageTokens int     `json:"image_tokens"`
	Cost        float64 `json:"cost"`
	// MIME is the type of Image, e.g. "image/jpeg".
	MIME  string `json:"mime"`
	Image []byte `json:"image"`
}

// ItemCost is the placement cost of item i of the plan on its own (no padding).
func (p *Plan) ItemCost(i int32) float64 {
	return p.Config.Placement.StepCost(p.Config.model().Cost(p.items[i]))
}

// Heaviest returns up to n planned real items with the largest ItemCost, the
// heaviest first (ties by item index).
func (p *Plan) Heaviest(n int) []int32 {
	var real []int32
	for _, s := range p.Steps {
		for _, rank := range s.Ranks {
			for _, mb := range rank {
				for _, e := range mb {
					if e.Weight > 0 {
						real = append(real, e.Item)
					}
				}
			}
		}
	}
	cost := make(map[int32]float64, len(real))
	for _, i := range real {
		cost[i] = p.ItemCost(i)
	}
	slices.SortFunc(real, func(a, b int32) int {
		if c := cmp.Compare(cost[b], cost[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	return real[:min(n, len(real))]
}

// sampleHistograms describes the plan's real samples.
func sampleHistograms(p *Plan) map[string]Histogram {
	var text, img, cost []float64
	for _, s := range p.Steps {
		for _, rank := range s.Ranks {
			for _, mb := range rank {
				for _, e := range mb {
					if e.Weight <= 0 {
						continue
					}
					it := p.items[e.Item]
					text = append(text, float64(it.TextTokens))
					img = append(img, float64(it.ImageTokens))
					cost = append(cost, p.ItemCost(e.Item))
				}
			}
		}
	}
	return map[string]Histogram{
		"text_tokens":  NewHistogram(text, HistogramBins),
		"image_tokens": NewHistogram(img, HistogramBins),
		"cost":         NewHistogram(cost, HistogramBins),
	}
}

// argmax returns the index of the largest value (-1 when empty).
func argmax(v []float64) int {
	best := -1
	for i, x := range v {
		if best < 0 || x > v[best] || math.IsNaN(v[best]) {
			best = i
		}
	}
	return best
}
