package pipeline

import (
	"context"
	"fmt"
	"io"
	"strings"

	"gocloud.dev/blob"

	"github.com/mmfeed/mmfeed/loader"
)

// Input is a dataset location ready for the loader: a local path, or the key of
// WebDataset shards on object storage with the Remote that streams them
// (Config.Loader.Remote). Close releases the connection after the last read.
type Input struct {
	Path   string
	Remote loader.Remote
	// Staged is true when the dataset was copied to the local cache (formats that
	// are not streamed).
	Staged bool
	close  func() error
}

// Close releases the object-store connection, if any.
func (in Input) Close() error {
	if in.close == nil {
		return nil
	}
	return in.close()
}

// OpenInput prepares input for the loader. WebDataset shards on object storage (a URL
// naming a .tar, .tar.gz or .tgz object, a brace pattern of them, or a prefix holding
// them and no manifest.jsonl) are streamed: the loader reads each shard's members as
// they arrive and re-reads an image with one ranged read, so nothing is copied and
// memory stays bounded. Other URLs (a JSONL manifest and its images, Parquet, an image
// folder) are staged into cacheDir with StageInput; a plain path is returned as it is.
// An http(s) URL must name shards (one, or a brace pattern): they are streamed with GET
// and ranged GETs.
func OpenInput(ctx context.Context, input, cacheDir string) (Input, error) {
	if isHTTP(input) {
		return openHTTPInput(input)
	}
	if !IsURL(input) || strings.HasPrefix(input, "file://") {
		local, err := StageInput(ctx, input, cacheDir)
		return Input{Path: local}, err
	}
	st, err := OpenStore(ctx, input)
	if err != nil {
		return Input{}, err
	}
	key := strings.TrimSuffix(st.prefix, "/")
	stream, err := streamable(ctx, st.bucket, key)
	if err != nil || !stream {
		st.Close()
		if err != nil {
			return Input{}, err
		}
		local, err := StageInput(ctx, input, cacheDir)
		return Input{Path: local, Staged: true}, err
	}
	return Input{Path: key, Remote: blobRemote{st.bucket}, close: st.Close}, nil
}

// streamable reports whether key names WebDataset shards: a shard key, a brace
// pattern, or a prefix with shards and no manifest.
func streamable(ctx context.Context, b *blob.Bucket, key string) (bool, error) {
	if strings.ContainsAny(key, "{}") || isShardKey(key) {
		return true, nil
	}
	prefix := key
	if prefix != "" {
		prefix += "/"
	}
	if ok, err := b.Exists(ctx, prefix+"manifest.jsonl"); err == nil && ok {
		return false, nil
	}
	it := b.List(&blob.ListOptions{Prefix: prefix})
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("pipeline: list %s: %w", key, err)
		}
		if !obj.IsDir && isShardKey(obj.Key) {
			return true, nil
		}
	}
}

func isShardKey(k string) bool {
	k = strings.ToLower(k)
	return strings.HasSuffix(k, ".tar") || strings.HasSuffix(k, ".tar.gz") || strings.HasSuffix(k, ".tgz")
}

// blobRemote serves a bucket's objects to the loader (loader.Remote).
type blobRemote struct{ b *blob.Bucket }

func (r blobRemote) List(ctx context.Context, prefix string) ([]string, error) {
	var out []string
	it := r.b.List(&blob.ListOptions{Prefix: prefix})
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			return out, nil // gocloud lists in lexical order
		}
		if err != nil {
			return nil, err
		}
		if !obj.IsDir {
			out = append(out, obj.Key)
		}
	}
}

func (r blobRemote) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	return r.b.NewReader(ctx, key, nil)
}

func (r blobRemote) ReadRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	rr, err := r.b.NewRangeReader(ctx, key, off, n, nil)
	if err != nil {
		return nil, err
	}
	defer rr.Close()
	return io.ReadAll(io.LimitReader(rr, n))
}
