package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"gocloud.dev/blob"
)

// IsURL reports whether loc is an object-storage or file:// URL rather than a path.
func IsURL(loc string) bool {
	scheme, _, ok := strings.Cut(loc, "://")
	return ok && scheme != "" && !strings.ContainsAny(scheme, "/\\")
}

// StageInput copies a dataset on object storage (s3://, gs://, az://, file://) into
// cacheDir and returns the local path that stands for it; a plain path is returned as it
// is. A URL that names an object (a JSONL manifest, a .tar or .parquet file) brings the
// objects under its folder (a manifest's images are relative to it); a URL that names a
// prefix brings everything under it (tar shards, Parquet files, an image folder). Objects
// already in cacheDir with the same size are kept, so an interrupted staging resumes.
// The loader then reads the local copy: the dataset must fit on the local disk.
func StageInput(ctx context.Context, input, cacheDir string) (string, error) {
	if !IsURL(input) {
		return input, nil
	}
	if rest, ok := strings.CutPrefix(input, "file://"); ok {
		return rest, nil
	}
	st, err := OpenStore(ctx, input)
	if err != nil {
		return "", err
	}
	defer st.Close()
	if cacheDir == "" {
		return "", errors.New("pipeline: an input URL needs a cache folder")
	}
	key := strings.TrimSuffix(st.prefix, "/")
	prefix, local := st.prefix, filepath.Join(cacheDir, filepath.FromSlash(key))
	if ok, err := st.bucket.Exists(ctx, key); err == nil && ok && key != "" {
		prefix = key[:strings.LastIndex(key, "/")+1] // the object's folder
	}
	n, err := st.copyPrefix(ctx, prefix, cacheDir)
	if err != nil {
		return "", err
	}
	if n == 0 {
		return "", fmt.Errorf("pipeline: input %s: no objects under %q", input, prefix)
	}
	return local, nil
}

// InputCacheDir is the default staging folder of an input URL: one per URL under base.
func InputCacheDir(base, input string) string {
	u, _, _ := strings.Cut(input, "?")
	h := sha256.Sum256([]byte(u))
	return filepath.Join(base, "input-"+hex.EncodeToString(h[:6]))
}

// copyPrefix copies every object under prefix to dir/<key> on 8 goroutines and returns
// how many objects there are.
func (s *Store) copyPrefix(ctx context.Context, prefix, dir string) (int, error) {
	type job struct {
		key  string
		size int64
	}
	jobs := make(chan job)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for j := range jobs {
				if err := s.copyObject(ctx, j.key, j.size, dir); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	n := 0
	it := s.bucket.List(&blob.ListOptions{Prefix: prefix})
	var listErr error
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			listErr = err
			break
		}
		if obj.IsDir {
			continue
		}
		n++
		jobs <- job{obj.Key, obj.Size}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	if err := errors.Join(listErr, <-errs); err != nil {
		return n, fmt.Errorf("pipeline: stage input: %w", err)
	}
	return n, nil
}

// copyObject downloads one object unless a file of its size is already there.
func (s *Store) copyObject(ctx context.Context, key string, size int64, dir string) error {
	clean := path.Clean("/" + key)
	if clean != "/"+key {
		return fmt.Errorf("object key %q is not a clean relative path", key)
	}
	dst := filepath.Join(dir, filepath.FromSlash(key))
	if st, err := os.Stat(dst); err == nil && st.Size() == size {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	r, err := s.bucket.NewReader(ctx, key, nil)
	if err != nil {
		return err
	}
	defer r.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".stage-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, r); err != nil {
		tmp.Close()
		return fmt.Errorf("%s: %w", key, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

// DefaultInputCache is the staging folder of input URLs when Config.InputCache is empty:
// mmfeed under the user's cache folder (the temporary folder where there is none).
func DefaultInputCache() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "mmfeed")
	}
	return os.TempDir()
}

// openConfigInput opens cfg.Input when it is a URL (OpenInput, staged under
// InputCacheDir of cfg.InputCache) and returns cfg with Input and Loader.Remote naming
// what the loader reads; a path is returned as it is, with an Input that closes nothing.
func openConfigInput(ctx context.Context, cfg Config) (Config, Input, error) {
	if !IsURL(cfg.Input) {
		return cfg, Input{Path: cfg.Input}, nil
	}
	base := cfg.InputCache
	if base == "" {
		base = DefaultInputCache()
	}
	in, err := OpenInput(ctx, cfg.Input, InputCacheDir(base, cfg.Input))
	if err != nil {
		return cfg, Input{}, fmt.Errorf("pipeline: input %s: %w", cfg.Input, err)
	}
	cfg.Input, cfg.Loader.Remote = in.Path, in.Remote
	return cfg, in, nil
}
