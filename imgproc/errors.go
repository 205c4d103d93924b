package imgproc

import "errors"

// Sentinel errors. Every error returned by this package wraps exactly one of
// them (test with errors.Is), so callers can quarantine samples by reason.
var (
	// ErrEmpty: the input has zero bytes.
	ErrEmpty = errors.New("imgproc: empty input")
	// ErrTooLarge: the file exceeds Config.MaxFileBytes, or its header
	// declares more than Config.MaxImagePixels pixels (decompression bomb).
	// Detected before any pixel buffer is allocated.
	ErrTooLarge = errors.New("imgproc: image too large")
	// ErrUnsupported: the content is not one of the supported formats (JPEG,
	// PNG, GIF, WebP, BMP, TIFF), whatever its file extension, or uses a
	// feature of the format that the decoder does not implement.
	ErrUnsupported = errors.New("imgproc: unsupported image format")
	// ErrCorrupt: the content is a recognised format but is truncated or
	// malformed, or the decoder failed (including a recovered panic).
	ErrCorrupt = errors.New("imgproc: corrupt image")
	// ErrConfig: the Config is invalid; returned by Config.Validate.
	ErrConfig = errors.New("imgproc: invalid config")
)
