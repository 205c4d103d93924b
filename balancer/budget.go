package balancer

import "fmt"

// Budget bounds one micro-batch so that it fits in device memory. Zero fields
// are unlimited.
type Budget struct {
	// MaxSamples bounds the number of entries (real or padding).
	MaxSamples int `json:"max_samples,omitempty"`
	// MaxPaddedTokens bounds the padded text tensor: entries × longest L.
	MaxPaddedTokens int `json:"max_padded_tokens,omitempty"`
	// MaxImageTokens bounds Σ P over the entries.
	MaxImageTokens int `json:"max_image_tokens,omitempty"`
	// MaxTokens bounds a packed micro-batch's Σ (L + P) over its entries
	// (Config.Pack only; a padded plan bounds MaxPaddedTokens instead).
	MaxTokens int `json:"max_tokens,omitempty"`
}

// Validate rejects negative limits.
func (b Budget) Validate() error {
	if b.MaxSamples < 0 || b.MaxPaddedTokens < 0 || b.MaxImageTokens < 0 || b.MaxTokens < 0 {
		return fmt.Errorf("balancer: budget %+v has a negative limit: %w", b, ErrInvalidConfig)
	}
	return nil
}

// Fits reports whether a micro-batch of count entries, longest text maxL and
// sumP image tokens is within the budget.
func (b Budget) Fits(count, maxL, sumP int) bool {
	return (b.MaxSamples == 0 || count <= b.MaxSamples) &&
		(b.MaxPaddedTokens == 0 || count*maxL <= b.MaxPaddedTokens) &&
		(b.MaxImageTokens == 0 || sumP <= b.MaxImageTokens)
}

// FitsPacked reports whether a packed micro-batch of count entries with
// sumL text and sumP image tokens is within the budget (MaxSamples,
// MaxImageTokens and MaxTokens; MaxPaddedTokens does not apply to packing).
func (b Budget) FitsPacked(count, sumL, sumP int) bool {
	return (b.MaxSamples == 0 || count <= b.MaxSamples) &&
		(b.MaxTokens == 0 || sumL+sumP <= b.MaxTokens) &&
		(b.MaxImageTokens == 0 || sumP <= b.MaxImageTokens)
}

// ItemFits reports, wrapping ErrBudgetExceeded, whether one item alone fits in a
// micro-batch.
func (b Budget) ItemFits(it Item) error {
	if !b.Fits(1, it.TextTokens, it.ImageTokens) || !b.FitsPacked(1, it.TextTokens, it.ImageTokens) {
		return fmt.Errorf("balancer: item %q (L=%d, P=%d) alone exceeds the micro-batch budget %+v: %w",
			it.ID, it.TextTokens, it.ImageTokens, b, ErrBudgetExceeded)
	}
	return nil
}

// Unlimited reports whether no limit is set.
func (b Budget) Unlimited() bool { return b == Budget{} }
