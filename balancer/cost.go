package balancer

import (
	"fmt"
	"strings"
)

// Feature indexes the linear cost model's features.
type Feature int

// The features of one sample; a rank's features are the sums over its samples.
const (
	FeatL          Feature = iota // L, text tokens
	FeatL2                        // L²
	FeatP                         // P, image tokens
	FeatP2                        // P²
	FeatLP                        // L·P (cross-attention scores)
	FeatComplexity                // image complexity: no GPU cost term (gpuFeature)
	FeatOne                       // 1 (per-sample overhead)
	NumFeatures
)

var featureNames = [NumFeatures]string{"L", "L2", "P", "P2", "LP", "complexity", "one"}

// String returns the feature's short name ("L", "L2", ...).
func (f Feature) String() string {
	if f < 0 || f >= NumFeatures {
		return fmt.Sprintf("Feature(%d)", int(f))
	}
	return featureNames[f]
}

// Features is a feature vector [L, L², P, P², L·P, complexity, 1], or a vector
// of coefficients over those features. Complexity rides along for the
// loader's decode accounting (plans, observations and padded sums keep it),
// but a CostModel's coefficient for it is always 0: at a fixed number of
// image tokens the GPU computes the same whatever the pixels hold, so no
// calibration could identify such a term (docs/cost-model.md).
type Features [NumFeatures]float64

// FeaturesOf returns the feature vector of one sample.
func FeaturesOf(textTokens, imageTokens int, complexity float64) Features {
	l, p := float64(textTokens), float64(imageTokens)
	return Features{l, l * l, p, p * p, l * p, complexity, 1}
}

// Add returns f + g.
func (f Features) Add(g Features) Features {
	for i := range f {
		f[i] += g[i]
	}
	return f
}

// Scale returns s·f.
func (f Features) Scale(s float64) Features {
	for i := range f {
		f[i] *= s
	}
	return f
}

// Dot returns Σ f[i]·g[i]. The explicit conversions keep the compiler from
// fusing multiply-adds, so results are identical on every architecture.
func (f Features) Dot(g Features) float64 {
	var s float64
	for i := range f {
		s += float64(f[i] * g[i])
	}
	return s
}

// Component indexes the three parts of a sample's cost.
type Component int

// Cost components.
const (
	Vision Component = iota // vision tower (mp rank 0 under modality placement)
	Text                    // text tower (mp rank 1 under modality placement)
	Fusion                  // cross-attention fusion, kept whole on one rank
	NumComponents
)

// String returns "vision", "text" or "fusion".
func (c Component) String() string {
	switch c {
	case Vision:
		return "vision"
	case Text:
		return "text"
	case Fusion:
		return "fusion"
	}
	return fmt.Sprintf("Component(%d)", int(c))
}

// Coefficients holds one coefficient vector per component: the cost of
// component c is Coefficients[c].Dot(features).
type Coefficients [NumComponents]Features

// Cost is a per-sample (or per-rank, summed) cost vector. The unit is the
// coefficients' unit: GFLOPs for shape-derived models, seconds after
// calibration.
type Cost struct {
	Vision float64 `json:"vision"`
	Text   float64 `json:"text"`
	Fusion float64 `json:"fusion"`
}

// Add returns c + d.
func (c Cost) Add(d Cost) Cost {
	return Cost{c.Vision + d.Vision, c.Text + d.Text, c.Fusion + d.Fusion}
}

// Sub returns c − d.
func (c Cost) Sub(d Cost) Cost {
	return Cost{c.Vision - d.Vision, c.Text - d.Text, c.Fusion - d.Fusion}
}

// Total returns vision + text + fusion.
func (c Cost) Total() float64 { return c.Vision + c.Text + c.Fusion }

// Placement says how the model's parts are laid out on a dp rank's devices.
type Placement int

// Placements.
const (
	// Colocated runs the whole model on each rank: step = Σ(vision+text+fusion).
	Colocated Placement = iota
	// Modality runs the towers on different mp ranks in parallel:
	// step = max(Σ vision, Σ text) + Σ fusion.
	Modality
)

// String returns "colocated" or "modality".
func (p Placement) String() string {
	switch p {
	case Colocated:
		return "colocated"
	case Modality:
		return "modality"
	}
	return fmt.Sprintf("Placement(%d)", int(p))
}

// ParsePlacement parses "colocated" or "modality" (case-insensitive).
func ParsePlacement(s string) (Placement, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "colocated", "":
		return Colocated, nil
	case "modality":
		return Modality, nil
	}
	return 0, fmt.Errorf("balancer: placement %q (want colocated|modality): %w", s, ErrUnknownName)
}

// MarshalText implements encoding.TextMarshaler.
func (p Placement) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (p *Placement) UnmarshalText(b []byte) error {
	v, err := ParsePlacement(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// StepCost returns the step time of a rank whose samples sum to c.
func (p Placement) StepCost(c Cost) float64 {
	if p == Modality {
		return max(c.Vision, c.Text) + c.Fusion
	}
	return c.Vision + c.Text + c.Fusion
}

// CostModel maps a sample to its cost vector.
type CostModel struct {
	// Coef are the coefficients over Features, one vector per component.
	Coef Coefficients `json:"coefficients"`
	// Unit names the cost unit ("GFLOP" or "s"); informational.
	Unit string `json:"unit"`
	// MicroBatchOverhead is the constant a packed micro-batch costs on top of
	// its samples (kernel launches, the packing itself). Every rank runs the
	// same number of micro-batches, so it changes no plan, only the
	// predicted step time; the FLOP prior sets 0.
	MicroBatchOverhead Cost `json:"micro_batch_overhead,omitzero"`
}

// NewCostModel returns the FLOP-derived model of shape (unit GFLOP).
func NewCostModel(shape ModelShape) (CostModel, error) {
	if err := shape.Validate(); err != nil {
		return CostModel{}, err
	}
	return CostModel{Coef: shape.Coefficients(), Unit: "GFLOP"}, nil
}

// Validate checks that every coefficient is finite and non-negative, and
// that none prices image complexity (the GPU cost has no such term; a model
// file from before it was removed is refused rather than silently changed).
func (m CostModel) Validate() error {
	for c := range NumComponents {
		for f := range NumFeatures {
			v := m.Coef[c][f]
			if !(v >= 0) || v > 1e300 {
				return fmt.Errorf("balancer: cost model %v coefficient of %v = %v: %w", c, f, v, ErrInvalidConfig)
			}
			if !gpuFeature(f) && v != 0 {
				return fmt.Errorf("balancer: cost model %v coefficient of %v = %v: image complexity is no GPU cost term (docs/cost-model.md): %w",
					c, f, v, ErrInvalidConfig)
			}
		}
	}
	o := m.MicroBatchOverhead
	for _, v := range []float64{o.Vision, o.Text, o.Fusion} {
		if !(v >= 0) || v > 1e300 {
			return fmt.Errorf("balancer: cost model micro-batch overhead %+v: %w", o, ErrInvalidConfig)
		}
	}
	return nil
}

// CostOf returns the cost vector of a feature vector (one sample or a sum).
func (m CostModel) CostOf(f Features) Cost {
	return Cost{m.Coef[Vision].Dot(f), m.Coef[Text].Dot(f), m.Coef[Fusion].Dot(f)}
}

// Cost returns the cost vector of one item.
func (m CostModel) Cost(it Item) Cost {
	return m.CostOf(FeaturesOf(it.TextTokens, it.ImageTokens, it.Complexity))
}

// Costs returns the cost vectors of items.
func (m CostModel) Costs(items []Item) []Cost {
	out := make([]Cost, len(items))
	for i, it := range items {
		out[i] = m.Cost(it)
	}
	return out
}
