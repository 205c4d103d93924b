package loader

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// WebDataset shards compressed with gzip (.tar.gz, .tgz) are read as
// streams: the gzip reader feeds archive/tar, members are grouped exactly as
// in a plain .tar, and offsets are positions in the inflated tar. Members the
// loader keeps are bounded by MaxImageBytes and MaxCaptionBytes before a byte
// of them is inflated into memory, so a gzip bomb costs inflation time (which
// stops when the context is done), never memory. A stream cut short or
// corrupt inside a member quarantines that sample as broken_tar, like a
// truncated plain tar.

// isGzipShard reports whether p names a gzip-compressed tar shard.
func isGzipShard(p string) bool {
	lower := strings.ToLower(p)
	return strings.HasSuffix(lower, ".tar.gz") || strings.HasSuffix(lower, ".tgz")
}

// shardStream is an open shard: a reader of the (inflated) tar that knows
// its offset. A plain tar's also seeks (archive/tar skips unread data by
// seeking); a gzip stream does not.
type shardStream interface {
	io.ReadCloser
	offset() int64
}

func (p *posReader) offset() int64 { return p.pos }
func (p *posReader) Close() error  { return p.f.Close() }

// gzStream inflates a .tar.gz shard, counting inflated bytes. Reads fail
// with the context's error once it is done, so skipping a huge member (or
// a bomb) stays cancellable.
type gzStream struct {
	f   io.Closer
	zr  *gzip.Reader
	pos int64
	ctx context.Context
}

func newGzStream(f io.ReadCloser) (*gzStream, error) {
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	return &gzStream{f: f, zr: zr, ctx: context.Background()}, nil
}

func (g *gzStream) Read(b []byte) (int, error) {
	if err := g.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := g.zr.Read(b[:min(len(b), readChunk)])
	g.pos += int64(n)
	return n, err
}

func (g *gzStream) offset() int64 { return g.pos }
func (g *gzStream) Close() error  { return g.f.Close() }

// gzTrailerMax is how much inflated data after the tar's end marker is read
// to reach the gzip trailer (tar writers pad to 10 KiB records); past it the
// trailer's checksum is not verified.
const gzTrailerMax = 1 << 20

// finishGz reads what follows the tar's end in a gzip shard so the gzip
// reader verifies its checksum and length; it returns a detail for a
// broken_tar reject, or "".
func finishGz(g *gzStream) string {
	n, err := io.Copy(io.Discard, io.LimitReader(g, gzTrailerMax+1))
	switch {
	case err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("after the last member, at inflated offset %d: %v", g.pos, err)
	case n > gzTrailerMax:
		return "" // long trailing data: the trailer is not checked
	}
	return ""
}

// gzSpools re-reads images of indexed .tar.gz shards: a shard is inflated
// once, on its first read, into a private temporary folder (up to the end of
// the last member the index references, so trailing data is never written),
// and read by offset from there like a plain tar. Safe for concurrent use;
// reads of one shard wait for its inflation. Close removes the folder.
type gzSpools struct {
	base   string           // Options.SpoolDir
	remote Remote           // Options.Remote: shards are its keys; nil: local files
	ends   map[string]int64 // shard -> inflated bytes the index needs
	mu     sync.Mutex
	dir    string // created on first use
	all    map[string]*gzSpool
}

type gzSpool struct {
	mu   sync.Mutex
	path string // the inflated copy, "" until made
	n    int64  // bytes in it
}

func newGzSpools(base string, entries []Entry, remote Remote) *gzSpools {
	ends := map[string]int64{}
	for _, e := range entries {
		if e.ref.kind == refTarGz {
			ends[e.ref.path] = max(ends[e.ref.path], e.ref.off+e.ImageSize)
		}
	}
	return &gzSpools{base: base, remote: remote, ends: ends, all: map[string]*gzSpool{}}
}

// read returns want bytes of e's image from its shard's inflated copy.
func (g *gzSpools) read(ctx context.Context, e Entry, want int64) ([]byte, error) {
	sp, err := g.spool(ctx, e.ref.root, e.ref.path)
	if err != nil {
		return nil, fmt.Errorf("loader: read %s: %w", e.Location, err)
	}
	local := e
	local.ref.root, local.ref.path = "", sp // the loader's own copy
	return readFileRange(ctx, local, e.ref.off, want, false)
}

// spool returns the path of shard's inflated copy, making it on first use
// (a local shard is opened below root, see openIn).
func (g *gzSpools) spool(ctx context.Context, root, shard string) (string, error) {
	g.mu.Lock()
	if g.dir == "" {
		dir, err := os.MkdirTemp(g.base, "mmfeed-tgz-")
		if err != nil {
			g.mu.Unlock()
			return "", fmt.Errorf("spool folder: %w", err)
		}
		g.dir = dir
	}
	sp := g.all[shard]
	if sp == nil {
		sp = &gzSpool{}
		g.all[shard] = sp
	}
	dir, limit := g.dir, g.ends[shard]
	n := len(g.all)
	g.mu.Unlock()

	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.path != "" {
		return sp.path, nil
	}
	dst := filepath.Join(dir, strconv.Itoa(n)+".tar")
	written, err := inflateTo(ctx, g.opener(root), shard, dst, limit)
	if err != nil {
		os.Remove(dst)
		return "", err // not kept: the next read tries again
	}
	sp.path, sp.n = dst, written
	return dst, nil
}

// inflateTo writes the first limit inflated bytes of the gzip file src to
// dst. A stream that ends (or breaks) earlier leaves a shorter copy: reads
// past its end fail with ErrStale, as for a plain tar that shrank.
func inflateTo(ctx context.Context, open func(context.Context, string) (io.ReadCloser, error), src, dst string, limit int64) (int64, error) {
	f, err := open(ctx, src)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	gz, err := newGzStream(f)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", src, err)
	}
	gz.ctx = ctx
	out, err := os.Create(dst)
	if err != nil {
		return 0, err
	}
	n, err := io.CopyN(out, gz, limit)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || (err != nil && ctx.Err() == nil && n > 0 && isGzipDataErr(err)) {
		err = nil // short: reads past n are stale
	}
	return n, errors.Join(err, out.Close())
}

func isGzipDataErr(err error) bool {
	return errors.Is(err, gzip.ErrChecksum) || errors.Is(err, gzip.ErrHeader) || strings.Contains(err.Error(), "flate")
}

// opener opens a shard for inflating: a remote object or a local file
// below root.
func (g *gzSpools) opener(root string) func(context.Context, string) (io.ReadCloser, error) {
	if g.remote != nil {
		return g.remote.Open
	}
	return func(_ context.Context, p string) (io.ReadCloser, error) {
		f, _, err := openIn(root, p)
		return f, err
	}
}

// Close removes the inflated copies.
func (g *gzSpools) close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dir == "" {
		return nil
	}
	err := os.RemoveAll(g.dir)
	g.dir, g.all = "", map[string]*gzSpool{}
	return err
}
