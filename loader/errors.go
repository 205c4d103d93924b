package loader

import "errors"

// Sentinel errors. Every error returned by this package wraps one of these (or
// an I/O error from the operating system), so callers can use errors.Is across
// layers.
var (
	// ErrUnknownFormat: Open could not tell what kind of dataset a path is.
	ErrUnknownFormat = errors.New("loader: unknown dataset format")
	// ErrNoData: a folder or glob matched no dataset files.
	ErrNoData = errors.New("loader: no dataset files")
	// ErrSchema: a Parquet or Arrow file lacks the configured image or text column, or
	// the column has a type the loader cannot read.
	ErrSchema = errors.New("loader: unsupported Parquet or Arrow schema")
	// ErrInvalidConfig: an Options value failed Validate.
	ErrInvalidConfig = errors.New("loader: invalid options")
	// ErrClosed: Next, ReadImage or ReadHeader was called after Close.
	ErrClosed = errors.New("loader: closed")
	// ErrStale: the image bytes changed since the index was built (size
	// differs), or the tar member at the recorded offset is gone.
	ErrStale = errors.New("loader: image changed since indexing")
	// ErrNoImageRef: the entry came from a source that cannot re-read
	// images by entry (a Source not built by Open).
	ErrNoImageRef = errors.New("loader: entry has no image reference")
	// ErrTooLarge: an image exceeds Options.MaxImageBytes on re-read.
	ErrTooLarge = errors.New("loader: image too large")
	// ErrMalformedParquet: a Parquet footer, page or column is malformed
	// (including input that makes the Parquet library panic, which the loader
	// recovers from), or the columns of a row group hold different row counts.
	ErrMalformedParquet = errors.New("loader: malformed parquet")
	// ErrNotRegular: a path the loader was to read is a named pipe, a device,
	// a socket or a directory; the loader never opens those for reading.
	ErrNotRegular = errors.New("loader: not a regular file")
	// ErrEscapesRoot: opening a file under the dataset root would leave it
	// (a symbolic link to a target outside, an absolute link, ".." above
	// the root), for example an image swapped for such a link after
	// indexing. Quarantined as "escapes_root".
	ErrEscapesRoot = errors.New("loader: path escapes the dataset root")
)
