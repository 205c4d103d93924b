package balancer

import (
	"fmt"
	"math"
)

// Item is one sample as the balancer sees it: cheap features only.
type Item struct {
	// ID is the stable sample id (unique within an epoch).
	ID string `json:"id"`
	// TextTokens is L: text tokens including special tokens, after truncation.
	TextTokens int `json:"text_tokens"`
	// ImageTokens is P: image patches (fixed for square or shorter-side crops,
	// variable for dynamic resolution).
	ImageTokens int `json:"image_tokens"`
	// Complexity is the image complexity estimate, roughly in [0,1]: what
	// decoding the image costs the loader's CPUs beyond its size. The GPU cost
	// has no term for it (docs/cost-model.md, "Image complexity").
	Complexity float64 `json:"complexity"`
}

// MaxItemTokens bounds TextTokens and ImageTokens of one item so that the
// quadratic features stay far from float64 precision limits.
const MaxItemTokens = 1 << 20

// MaxComplexity bounds Complexity; estimates are about [0,1].
const MaxComplexity = 1e6

// Validate reports why an item cannot be planned, wrapping ErrInvalidItem.
func (it Item) Validate() error {
	switch {
	case it.TextTokens < 0 || it.TextTokens > MaxItemTokens:
		return fmt.Errorf("balancer: item %q: text tokens %d outside [0, %d]: %w", it.ID, it.TextTokens, MaxItemTokens, ErrInvalidItem)
	case it.ImageTokens < 0 || it.ImageTokens > MaxItemTokens:
		return fmt.Errorf("balancer: item %q: image tokens %d outside [0, %d]: %w", it.ID, it.ImageTokens, MaxItemTokens, ErrInvalidItem)
	case math.IsNaN(it.Complexity) || it.Complexity < 0 || it.Complexity > MaxComplexity:
		return fmt.Errorf("balancer: item %q: complexity %v outside [0, %g]: %w", it.ID, it.Complexity, MaxComplexity, ErrInvalidItem)
	case it.TextTokens == 0 && it.ImageTokens == 0:
		return fmt.Errorf("balancer: item %q: no text and no image tokens: %w", it.ID, ErrInvalidItem)
	}
	return nil
}
