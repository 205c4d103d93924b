package pipeline

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/tokenize"
)

// FeatureCache keeps the features of a whole index (EntryFeatures in index
// order) under the dataset's fingerprint (Fingerprint), so that a restart or
// a second job on the same data does not run the feature pass again.
// Implementations: DirFeatureCache (a folder), and serve's JetStream object
// store. Safe for concurrent use.
type FeatureCache interface {
	// Load returns the features stored under fingerprint; ok is false when
	// there are none.
	Load(ctx context.Context, fingerprint string) (all []EntryFeatures, ok bool, err error)
	// Store keeps all under fingerprint.
	Store(ctx context.Context, fingerprint string, all []EntryFeatures) error
}

// fingerprintVersion changes when EntryFeatures or their computation
// change meaning, so that old cache entries are not read.
const fingerprintVersion = "mmfeed-features-2"

// Fingerprint names what the features of ix depend on, as a hex string:
//   - the settings that change them: the tokenizer's settings and the
//     SHA-256 of its file, the image config, the loader's options (not
//     where it spools);
//   - the index: every entry's id, location, caption and image size in
//     bytes (the index scan stats every image a manifest names, so a
//     replaced image of another size changes it at no extra cost);
//   - for an input on the local file system: the size and modification time
//     of each of its files (the manifest, the shards, a folder's files).
//
// Not covered: an image a manifest names replaced in place by one of
// exactly the same byte size (touch the manifest to invalidate), and the
// bytes of a remote input beyond what its index lists.
func Fingerprint(cfg Config, ix *loader.Index) (string, error) {
	tokPath := cfg.Tokenizer.Path
	if tokPath == "" {
		p, err := tokenize.DefaultTokenizerPath()
		if err != nil {
			return "", err
		}
		tokPath = p
	}
	tok, err := os.ReadFile(tokPath)
	if err != nil {
		return "", fmt.Errorf("pipeline: fingerprint: %w", err)
	}
	tokSum := sha256.Sum256(tok)
	tc := cfg.Tokenizer
	tc.Path, tc.Workers = "", 0
	lo := cfg.Loader
	lo.SpoolDir, lo.OnReject = "", nil
	settings, err := json.Marshal(struct {
		Version   string
		Tokenizer tokenize.Config
		TokSHA    string
		Image     imgproc.Config
		Loader    struct {
			loader.Options
			OnReject *struct{} `json:",omitempty"`
		}
	}{fingerprintVersion, tc, hex.EncodeToString(tokSum[:]), cfg.Image, struct {
		loader.Options
		OnReject *struct{} `json:",omitempty"`
	}{Options: lo}})
	if err != nil {
		return "", fmt.Errorf("pipeline: fingerprint: %w", err)
	}
	h := sha256.New()
	h.Write(settings)
	var n [8]byte
	field := func(s string) {
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		io.WriteString(h, s)
	}
	for lo := 0; lo < ix.Len(); lo += fingerprintChunk {
		for _, e := range ix.Entries(lo, min(ix.Len(), lo+fingerprintChunk)) {
			field(e.ID)
			field(e.Location)
			field(e.Text)
			binary.LittleEndian.PutUint64(n[:], uint64(e.ImageSize))
			h.Write(n[:])
		}
	}
	if cfg.Mixture != nil { // the sources, their options, weights and caps
		field(cfg.inputDefinition())
	}
	for _, in := range cfg.inputPaths() {
		if cfg.Loader.Remote != nil {
			break
		}
		files, err := localInputFiles(in)
		if err != nil {
			return "", err
		}
		for _, f := range files {
			st, err := os.Stat(f)
			if err != nil {
				return "", fmt.Errorf("pipeline: fingerprint: %w", err)
			}
			fmt.Fprintf(h, "\n%s %d %d", f, st.Size(), st.ModTime().UnixNano())
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:16]), nil
}

// fingerprintChunk is how many entries the fingerprint materialises at a time.
const fingerprintChunk = 4096

// localInputFiles lists the files of a local input: itself, a folder's
// files, or a glob's matches (none for a brace pattern: the index covers
// it).
func localInputFiles(input string) ([]string, error) {
	st, err := os.Stat(input)
	if err == nil && !st.IsDir() {
		return []string{input}, nil
	}
	if err == nil {
		var out []string
		err := filepath.WalkDir(input, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				out = append(out, p)
			}
			return nil
		})
		return out, err
	}
	m, _ := filepath.Glob(input)
	return m, nil
}

// DirFeatureCache is a FeatureCache in a folder: one gzipped JSON file
// features-<fingerprint>.json.gz per fingerprint, written to a temporary
// file and renamed, so concurrent jobs never read a partial file. The
// folder is created on the first Store.
type DirFeatureCache string

func (d DirFeatureCache) path(fp string) string {
	return filepath.Join(string(d), "features-"+fp+".json.gz")
}

// Load reads the fingerprint's file; a missing file is not an error, an
// unreadable one is (delete it).
func (d DirFeatureCache) Load(_ context.Context, fp string) ([]EntryFeatures, bool, error) {
	f, err := os.Open(d.path(fp))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("pipeline: feature cache: %w", err)
	}
	defer f.Close()
	all, err := ReadFeatures(f)
	if err != nil {
		return nil, false, fmt.Errorf("pipeline: feature cache %s: %w", f.Name(), err)
	}
	return all, true, nil
}

// Store writes the fingerprint's file.
func (d DirFeatureCache) Store(_ context.Context, fp string, all []EntryFeatures) error {
	if err := os.MkdirAll(string(d), 0o755); err != nil {
		return fmt.Errorf("pipeline: feature cache: %w", err)
	}
	tmp, err := os.CreateTemp(string(d), ".features-*.tmp")
	if err != nil {
		return fmt.Errorf("pipeline: feature cache: %w", err)
	}
	defer os.Remove(tmp.Name())
	err = WriteFeatures(tmp, all)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644) // as a plain file would be: another user's job may read it
	}
	if err == nil {
		err = os.Rename(tmp.Name(), d.path(fp))
	}
	if err != nil {
		return fmt.Errorf("pipeline: feature cache: %w", err)
	}
	return nil
}

// cachedFeatures returns the features of every entry of d.Index in index
// order: from Config.FeatureCache under the dataset's fingerprint (fp, and
// cached true), else from Config.Features or the feature pass on
// Config.Workers goroutines, then stored in the cache. A cache that cannot
// be read or written is skipped (the error is returned in warn), never
// fatal.
func (d *Dataset) cachedFeatures(ctx context.Context) (all []EntryFeatures, fp string, cached bool, warn error, err error) {
	cfg := d.Config
	fp, ferr := Fingerprint(cfg, d.Index)
	if ferr == nil {
		var ok bool
		all, ok, ferr = cfg.FeatureCache.Load(ctx, fp)
		if ferr == nil && ok && len(all) == d.Index.Len() {
			return all, fp, true, nil, nil
		}
		if ferr == nil && ok {
			ferr = fmt.Errorf("pipeline: cached features of %d entries for an index of %d", len(all), d.Index.Len())
		}
	} else {
		fp = ""
	}
	if cfg.Features != nil {
		all, err = cfg.Features(ctx, d.Index)
	} else {
		all, err = computeFeatures(ctx, d.Index, indexList(d.Index), d.Tokenizer, cfg.Image, cfg.workers(), cfg.Progress)
	}
	if err == nil && len(all) != d.Index.Len() {
		err = fmt.Errorf("pipeline: features of %d entries for an index of %d", len(all), d.Index.Len())
	}
	if err != nil {
		return nil, fp, false, ferr, err
	}
	if fp != "" {
		if serr := cfg.FeatureCache.Store(ctx, fp, all); serr != nil {
			ferr = errors.Join(ferr, serr)
		}
	}
	return all, fp, false, ferr, nil
}

// WriteFeatures writes all as gzipped JSON: the format of DirFeatureCache's
// files, and of serve's cached objects.
func WriteFeatures(w io.Writer, all []EntryFeatures) error {
	zw := gzip.NewWriter(w)
	err := json.NewEncoder(zw).Encode(all)
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pipeline: write features: %w", err)
	}
	return nil
}

// ReadFeatures reads what WriteFeatures wrote.
func ReadFeatures(r io.Reader) ([]EntryFeatures, error) {
	zr, err := gzip.NewReader(bufio.NewReader(r))
	if err != nil {
		return nil, fmt.Errorf("pipeline: read features: %w", err)
	}
	var all []EntryFeatures
	if err := json.NewDecoder(zr).Decode(&all); err != nil {
		return nil, fmt.Errorf("pipeline: read features: %w", err)
	}
	return all, nil
}
