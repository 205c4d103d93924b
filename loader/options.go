package loader

import (
	"fmt"
	"slices"
)

// Dataset formats accepted by Options.Format.
const (
	FormatAuto    = ""        // detect from the path
	FormatJSONL   = "jsonl"   // JSONL manifest
	FormatWDS     = "wds"     // WebDataset .tar shards
	FormatParquet = "parquet" // Parquet files
	FormatFolder  = "folder"  // images with sidecar .txt captions
	FormatArrow   = "arrow"   // Arrow IPC files; a HuggingFace save_to_disk folder (hfdisk.go)
)

// Options configures Open. The zero value of a field means its default, so
// Options{} is usable; DefaultOptions spells the defaults out.
type Options struct {
	// Keep names the source fields carried into the batches (see keep.go,
	// ParseKeep); Scan stores their values compactly in the index.
	Keep []KeepField `json:",omitempty"`
	// Format forces the dataset kind: "", "jsonl", "wds", "parquet",
	// "folder" or "arrow". "" detects it from the path.
	Format string
	// MaxImageBytes is the largest accepted image file in bytes; larger
	// images are quarantined as "too_large". Default 32 MiB.
	MaxImageBytes int64
	// MaxCaptionBytes is the largest accepted caption (a manifest line,
	// a .txt/.json member, a sidecar) in bytes. Default 1 MiB.
	MaxCaptionBytes int64
	// MaxRowGroupBytes bounds the uncompressed bytes of a Parquet row
	// group's image column, and of its text column, as the file's footer
	// states them, checked before the column is loaded; a larger row group is
	// quarantined as "too_large" (one reject for the row group). Default
	// 1 GiB.
	MaxRowGroupBytes int64
	// AllowAbsolute lets manifest lines name absolute image paths. Such
	// paths are trusted as given: they are not checked against the
	// dataset root. Default false: absolute paths are quarantined as
	// "escapes_root".
	AllowAbsolute bool
	// Root is the folder relative manifest image paths resolve against and
	// may not leave. Default: the manifest's folder. Image paths of Parquet
	// and Arrow rows (imagepath.go) resolve against it too (default: the
	// data file's folder).
	Root string
	// ImageColumn names the image: the Parquet column (binary, large binary,
	// or a struct with a binary "bytes" field and optionally a "path" string
	// used as ImageName; "image.bytes" names that field of the struct
	// "image"), or the manifest field holding the image path (a key or a
	// dotted path into nested objects, "image.path"). Default "image".
	ImageColumn string
	// TextColumn names the caption: the Parquet string column or the
	// manifest field (key or dotted path). Default "text"; under the default
	// a manifest line's "caption" stands in for an absent "text".
	TextColumn string
	// IDColumn names the optional id: the Parquet column (string or integer)
	// or the manifest field (string or number); absent ones are ignored.
	// Default "id".
	IDColumn string
	// WDSImageKeys lists the WebDataset member extensions that hold the
	// image, ";"-separated: "jpg;png;webp". Default DefaultWDSImageKeys.
	WDSImageKeys string
	// WDSTextKeys lists where the caption is, in priority order:
	// "txt" takes a whole member, "json:caption" a field of a JSON member
	// (a dotted path for nested fields). Default DefaultWDSTextKeys.
	WDSTextKeys string
	// SpoolDir is where Index.ReadImage inflates .tar.gz shards it re-reads
	// (one private folder, removed by Index.Close; the disk it takes is the
	// inflated size of the shards read). Default: os.TempDir().
	SpoolDir string
	// Remote, when set, is the object store Open reads the dataset from (path
	// is then a key, a prefix or a brace pattern of keys); only WebDataset
	// shards are read this way (see Remote).
	Remote Remote `json:"-"`
	// OnReject receives every quarantined sample, from the goroutine that
	// calls Next or Scan. Nil: rejects are only counted in Stats. Use
	// (*QuarantineWriter).Func to write quarantine.jsonl.
	OnReject func(Reject)
}

// DefaultOptions returns the defaults.
func DefaultOptions() Options {
	return Options{
		MaxImageBytes:    32 << 20,
		MaxCaptionBytes:  1 << 20,
		MaxRowGroupBytes: 1 << 30,
		ImageColumn:      "image",
		TextColumn:       "text",
		IDColumn:         "id",
	}
}

// Validate reports an invalid field, wrapping ErrInvalidConfig.
func (o Options) Validate() error {
	formats := []string{FormatAuto, FormatJSONL, FormatWDS, FormatParquet, FormatFolder, FormatArrow}
	if !slices.Contains(formats, o.Format) {
		return fmt.Errorf("%w: format %q (want one of jsonl, wds, parquet, folder, arrow)", ErrInvalidConfig, o.Format)
	}
	if _, err := parseWDSKeys(o.WDSImageKeys, o.WDSTextKeys); err != nil {
		return err
	}
	if o.MaxImageBytes < 0 {
		return fmt.Errorf("%w: MaxImageBytes %d < 0", ErrInvalidConfig, o.MaxImageBytes)
	}
	if o.MaxRowGroupBytes < 0 {
		return fmt.Errorf("%w: MaxRowGroupBytes %d < 0", ErrInvalidConfig, o.MaxRowGroupBytes)
	}
	if o.MaxCaptionBytes < 0 {
		return fmt.Errorf("%w: MaxCaptionBytes %d < 0", ErrInvalidConfig, o.MaxCaptionBytes)
	}
	return nil
}

// withDefaults fills zero fields with their defaults.
func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.MaxImageBytes == 0 {
		o.MaxImageBytes = d.MaxImageBytes
	}
	if o.MaxCaptionBytes == 0 {
		o.MaxCaptionBytes = d.MaxCaptionBytes
	}
	if o.MaxRowGroupBytes == 0 {
		o.MaxRowGroupBytes = d.MaxRowGroupBytes
	}
	if o.ImageColumn == "" {
		o.ImageColumn = d.ImageColumn
	}
	if o.TextColumn == "" {
		o.TextColumn = d.TextColumn
	}
	if o.IDColumn == "" {
		o.IDColumn = d.IDColumn
	}
	return o
}
