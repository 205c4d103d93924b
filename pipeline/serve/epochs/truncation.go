package epochs

import (
	"log/slog"

	"github.com/mmfeed/mmfeed/pipeline"
)

// WarnTruncation logs a warning when more than 1% of prep's captions were
// truncated at the tokenizer's MaxLength (pipeline.TruncationWarning); the
// count and share are in the report (text_truncation) either way.
func WarnTruncation(log *slog.Logger, prep *pipeline.Prepared) {
	if w := pipeline.TruncationWarning(prep.TextTruncation()); w != "" {
		log.Warn(w)
	}
}
