package loader

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"path"
	"strings"
	"unicode/utf8"
)

// Sample is one image–caption pair as read from a dataset.
type Sample struct {
	// ID is stable across runs; see the package doc for the derivation rule.
	ID string
	// Location is a human-readable source location, e.g.
	// "data/manifest.jsonl:17", "shard-0003.tar:000123",
	// "part-0.parquet:rg2:row41" or "imgs/cat.jpg".
	Location string
	// Text is the caption, untrimmed, possibly with invalid UTF-8 (the
	// tokenizer repairs it).
	Text string
	// Image holds the raw encoded image bytes; the caller owns them.
	Image []byte
	// ImageName is a file-name hint for the decoder, e.g. "000123.jpg";
	// may be "" when the dataset has none (Parquet without a path field).
	ImageName string
}

// Source yields samples. Next returns io.EOF after the last sample. Bad
// samples are reported through Options.OnReject and skipped; any other
// error is fatal for the source. Stats may be called at any time (also from
// another goroutine); after io.EOF it satisfies Seen == Emitted + Quarantined.
// Close releases files; it is safe to call more than once.
type Source interface {
	Next(ctx context.Context) (Sample, error)
	Stats() Stats
	Close() error
}

// DeriveID returns the first 16 hex digits of SHA-1(source + "#" + key).
func DeriveID(source, key string) string {
	h := sha1.New()
	h.Write([]byte(source))
	h.Write([]byte{'#'})
	h.Write([]byte(key))
	var sum [sha1.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:8])
}

// CheckCaption returns "" when text is an acceptable caption, else a reject
// reason. Rules: empty or white space only → ReasonEmptyCaption; binary →
// ReasonBinaryCaption, where binary means it contains a NUL byte, or at least
// a quarter of its bytes are invalid UTF-8 or control characters other than
// tab, newline and carriage return. Occasional invalid UTF-8 is accepted: the
// tokenizer repairs it.
func CheckCaption(text string) string {
	if strings.TrimSpace(text) == "" {
		return ReasonEmptyCaption
	}
	if strings.IndexByte(text, 0) >= 0 {
		return ReasonBinaryCaption
	}
	bad := 0
	for i := 0; i < len(text); {
		r, size := utf8.DecodeRuneInString(text[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			bad++
		case r < 0x20 && r != '\t' && r != '\n' && r != '\r', r == 0x7f:
			bad += size
		}
		i += size
	}
	if bad*4 >= len(text) {
		return ReasonBinaryCaption
	}
	return ""
}

// imageExts are the image extensions the sources recognise (lower case,
// without the dot).
var imageExts = map[string]bool{"jpg": true, "jpeg": true, "png": true, "webp": true}

// isImageExt reports whether ext (with or without a leading dot, any case)
// is a recognised image extension.
func isImageExt(ext string) bool {
	return imageExts[strings.ToLower(strings.TrimPrefix(ext, "."))]
}

// baseName returns the last element of a slash- or OS-separated path.
func baseName(p string) string {
	return path.Base(strings.ReplaceAll(p, "\\", "/"))
}
