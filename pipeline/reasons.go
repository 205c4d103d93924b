package pipeline

import (
	"errors"

	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/tokenize"
)

// Quarantine reasons of the feature and preprocessing stages (the loader's own reasons
// cover the source stage).
const (
	ReasonImageEmpty       = loader.ReasonEmptyImage // one code for an empty image, whichever stage finds it
	ReasonImageTooLarge    = "image_too_large"
	ReasonImageUnsupported = "image_unsupported"
	ReasonImageCorrupt     = "image_corrupt"
	ReasonTextUnencodable  = "text_unencodable"
	ReasonReadFailed       = loader.ReasonUnreadableImage
	ReasonEscapesRoot      = loader.ReasonEscapesRoot // a re-read would leave the dataset root (a file swapped for a link)
)

// errUnreadable wraps I/O failures of reading an image the index listed.
var errUnreadable = errors.New("image unreadable")

// reasonOf classifies an imgproc or tokenize error into a quarantine reason.
func reasonOf(err error) string {
	switch {
	case errors.Is(err, loader.ErrEscapesRoot):
		return ReasonEscapesRoot
	case errors.Is(err, errUnreadable):
		return ReasonReadFailed
	case errors.Is(err, imgproc.ErrEmpty):
		return ReasonImageEmpty
	case errors.Is(err, imgproc.ErrTooLarge):
		return ReasonImageTooLarge
	case errors.Is(err, imgproc.ErrUnsupported):
		return ReasonImageUnsupported
	case errors.Is(err, tokenize.ErrEncode):
		return ReasonTextUnencodable
	default:
		return ReasonImageCorrupt
	}
}
