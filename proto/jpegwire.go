package proto

import (
	"fmt"
	"strings"
)

// DTypeJPEGSource: each row's pixel_values is one JPEG that the trainer
// decodes and resizes to the row's pixel_shape (the planned C,H,W) with the
// batch's FieldResize policy and filter: the source file's own bytes, or,
// for a source that is not an acceptable JPEG, a baseline JPEG already at
// pixel_shape (a resize to the same size is none). Rows are at most
// MaxSourceJPEGBytes; the trainer refuses JPEGs of more than
// MaxSourceJPEGPixels before decoding them.
const DTypeJPEGSource = "jpeg-source"

// FieldResize is the pixel_values metadata key of DTypeJPEGSource batches
// (absent otherwise): "<policy>/<filter>", e.g. "shorter-crop/bilinear",
// the resize the trainer applies (BatchMeta.Resize).
const FieldResize = "resize"

// Limits of a DTypeJPEGSource row, enforced by BuildRecord and again by the
// trainer before decoding (trainer schema_keys.json "jpeg_source"; a test
// fails when they drift).
const (
	MaxSourceJPEGBytes  = 1 << 20
	MaxSourceJPEGPixels = 1 << 22
)

// Resize policies and filters a FieldResize value names.
var (
	resizePolicies = []string{"shorter-crop", "square", "dynamic"}
	resizeFilters  = []string{"bilinear", "bicubic"}
)

// IsJPEGDType reports whether rows of dtype are JPEG bytes, not tensors.
func IsJPEGDType(dtype string) bool { return dtype == DTypeJPEG || dtype == DTypeJPEGSource }

// validateResize checks BatchMeta.Resize: "<policy>/<filter>" under
// DTypeJPEGSource, empty under every other dtype.
func (m BatchMeta) validateResize() error {
	if m.DType != DTypeJPEGSource {
		if m.Resize != "" {
			return fmt.Errorf("proto: resize %q with dtype %s (only %s resizes in the trainer): %w", m.Resize, m.DType, DTypeJPEGSource, ErrInvalidMeta)
		}
		return nil
	}
	policy, filter, ok := strings.Cut(m.Resize, "/")
	if !ok || !contains(resizePolicies, policy) || !contains(resizeFilters, filter) {
		return fmt.Errorf("proto: resize %q (want <%s>/<%s>): %w", m.Resize, strings.Join(resizePolicies, "|"), strings.Join(resizeFilters, "|"), ErrInvalidMeta)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// validateJPEGRow bounds the size (bytes) of one JPEG row of shape n pixel
// values.
func validateJPEGRow(dtype string, shape []int32, n, size int64) error {
	if dtype == DTypeJPEGSource {
		if size < 1 || size > MaxSourceJPEGBytes {
			return fmt.Errorf("%d source JPEG bytes (want 1 to %d): %w", size, MaxSourceJPEGBytes, ErrInvalidRow)
		}
		return nil
	}
	if size < 1 || size > n*2+MaxJPEGOverhead {
		return fmt.Errorf("%d JPEG bytes for shape %v (want 1 to 2 per pixel value + %d): %w", size, shape, MaxJPEGOverhead, ErrInvalidRow)
	}
	return nil
}
