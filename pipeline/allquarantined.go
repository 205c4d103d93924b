package pipeline

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/mmfeed/mmfeed/loader"
)

// ErrAllQuarantined is wrapped by the error of an epoch whose every sample
// was quarantined (the input held samples, none is left to plan): `shard`,
// `report` and `serve` exit non-zero with it instead of writing nothing.
var ErrAllQuarantined = errors.New("every sample was quarantined")

// AllQuarantinedError says why nothing is left: the most frequent
// quarantine reason, its count, one example and the fix for that reason.
type AllQuarantinedError struct {
	Input   string
	Total   int64  // samples quarantined
	Reason  string // the most frequent reason (ties: the first by name)
	Count   int64  // samples quarantined for Reason
	Example string // location and detail of one sample quarantined for Reason ("" when unknown)
	Fix     string // what to change for Reason
}

func (e *AllQuarantinedError) Error() string {
	ex := ""
	if e.Example != "" {
		ex = " (e.g. " + e.Example + ")"
	}
	return fmt.Sprintf("pipeline: %s: all %d samples were quarantined, nothing to plan; top reason %s: %d samples%s; fix: %s",
		e.Input, e.Total, e.Reason, e.Count, ex, e.Fix)
}

func (e *AllQuarantinedError) Unwrap() error { return ErrAllQuarantined }

// checkSomeLeft fails with an AllQuarantinedError when no item is left to
// plan while samples were quarantined; examples are the rejects whose
// details it may quote (the index scan's).
func checkSomeLeft(input string, items int, q *loader.QuarantineWriter, examples []loader.Reject) error {
	if items > 0 || q.Total() == 0 {
		return nil
	}
	type rc struct {
		reason string
		n      int64
	}
	var counts []rc
	for r, n := range q.Counts() {
		counts = append(counts, rc{r, n})
	}
	slices.SortFunc(counts, func(a, b rc) int { return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.reason, b.reason)) })
	top := counts[0]
	e := &AllQuarantinedError{Input: input, Total: q.Total(), Reason: top.reason, Count: top.n}
	detail := ""
	for _, r := range examples {
		if r.Reason == top.reason {
			e.Example, detail = r.Location+": "+r.Detail, r.Detail
			break
		}
	}
	e.Fix = fixFor(top.reason, detail)
	return e
}

// fixFor is the concrete change that addresses a quarantine reason, refined
// by one reject's detail.
func fixFor(reason, detail string) string {
	switch reason {
	case loader.ReasonMissingImage:
		if detail == "null image" {
			return "the image column is null in every row: name the column that holds the image bytes or paths with --image-field " +
				"(a HuggingFace Image struct: --image-field image.bytes; its paths are read below --root, default the file's folder)"
		}
		return "the image files are not where the paths point: set --root to the folder the image paths are relative to " +
			"(default: the manifest's or Parquet file's folder), or --image-field to the field that holds them"
	case loader.ReasonMissingCaption, loader.ReasonEmptyCaption:
		return "no caption in the text column: name the caption column or field with --text-field (e.g. --text-field caption)"
	case loader.ReasonEscapesRoot:
		return "the image paths leave the dataset folder: set --root to a folder that holds every image " +
			"(or, for absolute paths you trust, --allow-absolute-paths)"
	case loader.ReasonBadManifestLine:
		return "the manifest lines lack the fields: name them with --image-field and --text-field (dotted for nested fields)"
	case loader.ReasonTooLarge:
		return "every sample is over the loader's size limits (image, caption, or a Parquet row group / Arrow record batch): " +
			"split the files into smaller row groups or check the columns named by --image-field and --text-field"
	case loader.ReasonNotRegular, loader.ReasonUnreadableImage:
		return "the image files cannot be read as regular files: check their permissions and that the paths name files"
	case ReasonImageCorrupt, ReasonImageUnsupported, loader.ReasonEmptyImage:
		return "the images do not decode as JPEG, PNG or WebP: check that --image-field names the images " +
			"(in Parquet or Arrow, the bytes: image.bytes of an HF Image struct, not a path or another column)"
	case ReasonImageTooLarge:
		return "every image is over the decoder's pixel limit: raise --max-image-pixels if the images are trusted"
	case ReasonTextUnencodable:
		return "the tokenizer cannot encode the captions: check --tokenizer and --text-field"
	case loader.ReasonDuplicateID:
		return "the ids repeat: name a column or field of unique ids with --id-field"
	case loader.ReasonBadParquetFile, loader.ReasonBadParquetRow, loader.ReasonBadArrowFile:
		return "the data files cannot be read or lack the columns: check them, and --image-field and --text-field"
	}
	return "see each sample's detail in quarantine.jsonl (or --quarantine FILE)"
}
