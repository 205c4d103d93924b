package balancer

// TextTruncation counts the captions whose token count reached the
// tokenizer's maximum length: those were cut (a caption exactly MaxLength
// tokens long counts too; the count cannot tell them apart). The caller,
// who knows the tokenizer, sets Report.TextTruncation.
type TextTruncation struct {
	// MaxLength is the tokenizer's truncation length (special tokens included).
	MaxLength int `json:"max_length"`
	// Captions counts the captions looked at; AtMaxLength those at
	// MaxLength tokens; Share is AtMaxLength / Captions (0 without captions).
	Captions    int     `json:"captions"`
	AtMaxLength int     `json:"at_max_length"`
	Share       float64 `json:"share"`
}

// CountTextTruncation counts the items whose TextTokens reached maxLength;
// nil when maxLength ≤ 0 (no truncation).
func CountTextTruncation(items []Item, maxLength int) *TextTruncation {
	if maxLength <= 0 {
		return nil
	}
	t := &TextTruncation{MaxLength: maxLength, Captions: len(items)}
	for _, it := range items {
		if it.TextTokens >= maxLength {
			t.AtMaxLength++
		}
	}
	if t.Captions > 0 {
		t.Share = float64(t.AtMaxLength) / float64(t.Captions)
	}
	return t
}
