package loader

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ManifestName is the manifest file Open looks for in a folder.
const ManifestName = "manifest.jsonl"

// Open detects what path is (see the package doc) and returns a Source over
// it. opts zero fields take their defaults. Open fails only when the path
// cannot be read, matches no data, or the options are invalid.
func Open(path string, opts Options) (Source, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	if opts.Remote != nil {
		return openRemote(context.Background(), opts.Remote, path, opts)
	}
	format, files, err := detect(path, opts.Format)
	if err != nil {
		return nil, err
	}
	switch format {
	case FormatJSONL:
		return openManifests(files, opts)
	case FormatWDS:
		return newTarSource(files, opts), nil
	case FormatParquet:
		return newParquetSource(files, opts), nil
	case FormatArrow:
		return newArrowSource(files, opts), nil
	default:
		return openFolder(path, opts)
	}
}

// detect returns the format and the data files of path.
func detect(path, forced string) (string, []string, error) {
	if strings.ContainsAny(path, "{}") {
		return detectBraces(path, forced)
	}
	if strings.ContainsAny(path, "*?[") {
		return detectGlob(path, forced)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", nil, fmt.Errorf("loader: open %s: %w", path, err)
	}
	if !fi.IsDir() {
		format := forced
		if format == FormatAuto {
			format = formatOfExt(path)
		}
		if format == FormatAuto || format == FormatFolder {
			return "", nil, fmt.Errorf("%w: %s (want .jsonl, .tar, .tar.gz, .parquet or .arrow)", ErrUnknownFormat, path)
		}
		return format, []string{path}, nil
	}
	return detectDir(path, forced)
}

// detectBraces expands a brace pattern into files that must all exist and
// share one format.
func detectBraces(pattern, forced string) (string, []string, error) {
	paths, err := expandBraces(pattern)
	if err != nil {
		return "", nil, err
	}
	format := forced
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return "", nil, fmt.Errorf("loader: open %s (from %s): %w", p, pattern, err)
		}
		f := formatOfExt(p)
		if format == FormatAuto {
			format = f
		}
		if fi.IsDir() || f != format || f == FormatAuto {
			return "", nil, fmt.Errorf("%w: %s mixes or names unsupported files (%s)", ErrUnknownFormat, pattern, p)
		}
	}
	return format, paths, nil
}

func detectGlob(pattern, forced string) (string, []string, error) {
	matches, err := filepath.Glob(pattern)
	if err != nil {
		return "", nil, fmt.Errorf("%w: glob %q: %v", ErrUnknownFormat, pattern, err)
	}
	slices.Sort(matches)
	if len(matches) == 0 {
		return "", nil, fmt.Errorf("%w: %s", ErrNoData, pattern)
	}
	format := forced
	for _, m := range matches {
		f := formatOfExt(m)
		if format == FormatAuto {
			format = f
		}
		if f != format || f == FormatAuto {
			return "", nil, fmt.Errorf("%w: glob %s mixes or holds unsupported files (%s)", ErrUnknownFormat, pattern, m)
		}
	}
	return format, matches, nil
}

func detectDir(dir, forced string) (string, []string, error) {
	manifest := filepath.Join(dir, ManifestName)
	if forced == FormatJSONL || forced == FormatAuto {
		if _, err := os.Stat(manifest); err == nil {
			return FormatJSONL, []string{manifest}, nil
		} else if forced == FormatJSONL {
			return "", nil, fmt.Errorf("loader: open %s: %w", manifest, err)
		}
	}
	if forced == FormatFolder {
		return FormatFolder, nil, nil
	}
	if forced == FormatAuto || forced == FormatArrow {
		if files, ok, err := detectHFDisk(dir); ok || err != nil {
			return FormatArrow, files, err
		}
	}
	byFormat, err := listDataFiles(dir)
	if err != nil {
		return "", nil, err
	}
	for _, f := range []string{FormatWDS, FormatParquet} {
		if (forced == FormatAuto || forced == f) && len(byFormat[f]) > 0 {
			return f, byFormat[f], nil
		}
	}
	if forced != FormatAuto {
		return "", nil, fmt.Errorf("%w: no %s files under %s", ErrNoData, forced, dir)
	}
	return FormatFolder, nil, nil
}

// listDataFiles walks dir and groups .tar (.tar.gz, .tgz) and .parquet files by format, in
// lexical order.
func listDataFiles(dir string) (map[string][]string, error) {
	out := map[string][]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			if f := formatOfExt(p); f == FormatWDS || f == FormatParquet {
				out[f] = append(out[f], p)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loader: list %s: %w", dir, err)
	}
	return out, nil
}

func formatOfExt(p string) string {
	if isGzipShard(p) {
		return FormatWDS
	}
	switch strings.ToLower(filepath.Ext(p)) {
	case ".jsonl":
		return FormatJSONL
	case ".tar":
		return FormatWDS
	case ".parquet":
		return FormatParquet
	case ".arrow":
		return FormatArrow
	}
	return FormatAuto
}

// base holds what every built-in source shares: options, counters, the
// reject hook and the closed flag.
type base struct {
	opts   Options
	tally  Tally
	closed bool
	// json is the JSON object of the entry next returned last (a manifest
	// line, a WebDataset .json member; nil without), read by Scan for the
	// kept fields (Options.Keep) before the next call.
	json []byte
}

// lastJSON is the JSON object of the entry er returned last (nil for a foreign source).
func lastJSON(er entryReader) []byte {
	if er == nil {
		return nil
	}
	return er.shared().json
}

// Stats returns the source's counters.
func (b *base) Stats() Stats { return b.tally.Stats() }

// reject counts and reports one quarantined sample.
func (b *base) reject(id, location, reason, detail string) {
	b.tally.Quarantine(reason)
	if b.opts.OnReject != nil {
		b.opts.OnReject(Reject{ID: id, Location: location, Reason: reason, Detail: detail})
	}
}

func (b *base) shared() *base { return b }

// entryReader is implemented by every built-in source: next returns the next
// good entry, with its image bytes when withImage is set. It counts emitted
// samples and reports rejects itself.
type entryReader interface {
	Source
	next(ctx context.Context, withImage bool) (Entry, []byte, error)
	shared() *base
}

// nextSample implements Source.Next on top of an entryReader.
func nextSample(ctx context.Context, r entryReader) (Sample, error) {
	e, img, err := r.next(ctx, true)
	if err != nil {
		return Sample{}, err
	}
	return e.sample(img), nil
}
