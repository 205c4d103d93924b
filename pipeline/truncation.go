package pipeline

import (
	"fmt"

	"github.com/mmfeed/mmfeed/balancer"
)

// TruncationWarnShare is the share of captions at the tokenizer's maximum
// length above which TruncationWarning warns.
const TruncationWarnShare = 0.01

// TextTruncation counts the prepared captions cut at the tokenizer's
// MaxLength (balancer.CountTextTruncation); nil without truncation.
func (p *Prepared) TextTruncation() *balancer.TextTruncation {
	if p.Tokenizer == nil {
		return nil
	}
	return balancer.CountTextTruncation(p.Features.Items, p.Tokenizer.MaxLength())
}

// TruncationWarning returns the warning for t when more than
// TruncationWarnShare of the captions were cut, else "".
func TruncationWarning(t *balancer.TextTruncation) string {
	if t == nil || t.Share <= TruncationWarnShare {
		return ""
	}
	return fmt.Sprintf("%d of %d captions (%.1f%%) reached --max-length %d and were truncated (a caption exactly that long counts too): raise --max-length to keep their text",
		t.AtMaxLength, t.Captions, 100*t.Share, t.MaxLength)
}
