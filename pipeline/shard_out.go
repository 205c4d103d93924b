package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/url"
	"path/filepath"
	"strings"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/azureblob" // az://
	"gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/gcsblob" // gs://
	_ "gocloud.dev/blob/s3blob"  // s3://
	"gocloud.dev/gcerrors"
)

// Store is where a shard set lives: a local folder or an object-store prefix
// (s3://bucket/prefix, gs://, az://, file:///path), through gocloud.dev/blob
// with credentials from the usual environment (AWS_*, GOOGLE_APPLICATION_CREDENTIALS,
// AZURE_STORAGE_*). An object appears only when its writer closes without
// error, so a crash never leaves a half-written file under its final name.
type Store struct {
	bucket *blob.Bucket
	prefix string // "" or ending in "/"
	url    string
}

// OpenStore opens the folder or URL loc. A plain path (or file://) is a local
// folder, created when missing.
func OpenStore(ctx context.Context, loc string) (*Store, error) {
	scheme, rest, ok := strings.Cut(loc, "://")
	if !ok || scheme == "file" {
		dir := loc
		if ok {
			dir = rest
		}
		abs, err := filepath.Abs(dir)
		if err != nil {
			return nil, err
		}
		b, err := fileblob.OpenBucket(abs, &fileblob.Options{CreateDir: true, NoTempDir: true, Metadata: fileblob.MetadataDontWrite})
		if err != nil {
			return nil, fmt.Errorf("pipeline: open %s: %w", loc, err)
		}
		return &Store{bucket: b, url: loc}, nil
	}
	u, err := url.Parse(loc)
	if err != nil {
		return nil, fmt.Errorf("pipeline: store url %q: %w", loc, err)
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		prefix += "/"
	}
	u.Path = ""
	b, err := blob.OpenBucket(ctx, u.String())
	if err != nil {
		return nil, fmt.Errorf("pipeline: open %s: %w", loc, err)
	}
	return &Store{bucket: b, prefix: prefix, url: loc}, nil
}

// URL is the location the store was opened with.
func (s *Store) URL() string { return s.url }

// Close releases the bucket.
func (s *Store) Close() error { return s.bucket.Close() }

// Create starts the object name. Its content becomes visible when Close
// returns nil; cancelling ctx before Close discards it.
func (s *Store) Create(ctx context.Context, name string) (*StoreWriter, error) {
	w, err := s.bucket.NewWriter(ctx, s.prefix+name, nil)
	if err != nil {
		return nil, fmt.Errorf("pipeline: create %s: %w", name, err)
	}
	h := sha256.New()
	return &StoreWriter{w: w, h: h, mw: io.MultiWriter(w, h)}, nil
}

// WriteFile creates name and fills it with write.
func (s *Store) WriteFile(ctx context.Context, name string, write func(io.Writer) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.Create(ctx, name)
	if err != nil {
		return err
	}
	if err := write(w); err != nil {
		cancel()
		w.Close()
		return fmt.Errorf("pipeline: write %s: %w", name, err)
	}
	return w.Close()
}

// ReadAll returns the content of name; a missing object gives an error that
// wraps ErrNotExist.
func (s *Store) ReadAll(ctx context.Context, name string) ([]byte, error) {
	b, err := s.bucket.ReadAll(ctx, s.prefix+name)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return nil, fmt.Errorf("pipeline: %s: %w", name, ErrNotExist)
	}
	return b, err
}

// Hash returns the size and the hex SHA-256 of name's content.
func (s *Store) Hash(ctx context.Context, name string) (int64, string, error) {
	r, err := s.bucket.NewReader(ctx, s.prefix+name, nil)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return 0, "", fmt.Errorf("pipeline: %s: %w", name, ErrNotExist)
	}
	if err != nil {
		return 0, "", err
	}
	defer r.Close()
	h := sha256.New()
	n, err := io.Copy(h, r)
	return n, hex.EncodeToString(h.Sum(nil)), err
}

// Delete removes name; a missing object is not an error.
func (s *Store) Delete(ctx context.Context, name string) error {
	err := s.bucket.Delete(ctx, s.prefix+name)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return nil
	}
	return err
}

// ErrNotExist: the object is not in the store.
var ErrNotExist = errors.New("pipeline: no such object")

// StoreWriter writes one object and hashes what it writes.
type StoreWriter struct {
	w  *blob.Writer
	h  hash.Hash
	mw io.Writer
	n  int64
}

func (w *StoreWriter) Write(p []byte) (int, error) {
	n, err := w.mw.Write(p)
	w.n += int64(n)
	return n, err
}

// Close commits the object.
func (w *StoreWriter) Close() error { return w.w.Close() }

// Size and SHA256 describe what was written.
func (w *StoreWriter) Size() int64    { return w.n }
func (w *StoreWriter) SHA256() string { return hex.EncodeToString(w.h.Sum(nil)) }
