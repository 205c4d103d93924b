package loader

import (
	"context"
	"fmt"
	"io"
	"strings"
)

// Remote serves a dataset that lives on object storage (S3, GCS, Azure, via
// the caller's client; the loader imports none). With Options.Remote set,
// Open reads WebDataset shards (.tar, .tar.gz, .tgz) from it as streams:
// members are grouped as they arrive, nothing is staged on disk and memory
// stays bounded by the image and caption limits. Index re-reads an image
// with one ranged read (a .tar.gz shard is inflated once into the spool
// folder instead). Implementations must be safe for concurrent use.
type Remote interface {
	// List returns the keys of the objects under prefix, in lexical order.
	List(ctx context.Context, prefix string) ([]string, error)
	// Open streams the object key from its first byte.
	Open(ctx context.Context, key string) (io.ReadCloser, error)
	// ReadRange returns the n bytes at offset off of the object key; fewer
	// when the object is shorter.
	ReadRange(ctx context.Context, key string, off, n int64) ([]byte, error)
}

// openRemote lists the shards a path names on r: one object (a .tar, .tar.gz
// or .tgz key), a brace pattern of them, or a prefix holding them.
func openRemote(ctx context.Context, r Remote, path string, opts Options) (Source, error) {
	if opts.Format != FormatAuto && opts.Format != FormatWDS {
		return nil, fmt.Errorf("%w: %s: only WebDataset shards are read from object storage, not %s", ErrUnknownFormat, path, opts.Format)
	}
	var shards []string
	switch {
	case strings.ContainsAny(path, "{}"):
		keys, err := expandBraces(path)
		if err != nil {
			return nil, err
		}
		shards = keys
	case formatOfExt(path) == FormatWDS:
		shards = []string{path}
	default:
		prefix := strings.TrimSuffix(path, "/")
		if prefix != "" {
			prefix += "/"
		}
		keys, err := r.List(ctx, prefix)
		if err != nil {
			return nil, fmt.Errorf("loader: list %s: %w", path, err)
		}
		for _, k := range keys {
			if formatOfExt(k) == FormatWDS {
				shards = append(shards, k)
			}
		}
	}
	for _, s := range shards {
		if formatOfExt(s) != FormatWDS {
			return nil, fmt.Errorf("%w: %s: only WebDataset shards (.tar, .tar.gz, .tgz) are read from object storage", ErrUnknownFormat, s)
		}
	}
	if len(shards) == 0 {
		return nil, fmt.Errorf("%w: no .tar, .tar.gz or .tgz objects under %s", ErrNoData, path)
	}
	src := newTarSource(shards, opts)
	src.stream = r.Open
	return src, nil
}

// ctxStream is an unseekable shard stream (a remote object) that counts its
// offset. ctx is the current Next call's: once it is done, reads fail with
// its error, and a read blocked on the network is aborted by cancelling the
// stream (cancel ends the context the object was opened with).
type ctxStream struct {
	r      io.ReadCloser
	pos    int64
	ctx    context.Context
	cancel context.CancelFunc
}

func (c *ctxStream) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	stop := context.AfterFunc(c.ctx, c.cancel)
	n, err := c.r.Read(b[:min(len(b), readChunk)])
	stop()
	c.pos += int64(n)
	if err != nil && c.ctx.Err() != nil {
		err = c.ctx.Err()
	}
	return n, err
}

func (c *ctxStream) offset() int64 { return c.pos }

func (c *ctxStream) Close() error {
	c.cancel()
	return c.r.Close()
}

// readRemote re-reads want bytes of e's image with one ranged read.
func readRemote(ctx context.Context, r Remote, e Entry, want int64) ([]byte, error) {
	b, err := r.ReadRange(ctx, e.ref.path, e.ref.off, want)
	if err != nil {
		return nil, fmt.Errorf("loader: read %s: %w", e.Location, err)
	}
	if int64(len(b)) != want {
		return nil, fmt.Errorf("loader: read %s: %d bytes at %d, got %d: %w", e.Location, want, e.ref.off, len(b), ErrStale)
	}
	return b, nil
}
