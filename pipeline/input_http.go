package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// isHTTP reports whether input is an http:// or https:// URL.
func isHTTP(input string) bool {
	l := strings.ToLower(input)
	return strings.HasPrefix(l, "http://") || strings.HasPrefix(l, "https://")
}

// openHTTPInput streams WebDataset shards named by an http(s) URL: one shard, or a
// brace pattern of them (HTTP cannot list a prefix).
func openHTTPInput(input string) (Input, error) {
	if !strings.ContainsAny(input, "{}") && !isShardKey(input) {
		return Input{}, fmt.Errorf("pipeline: input %s: an http(s) input names WebDataset shards (.tar, .tar.gz, .tgz, or a brace pattern of them)", input)
	}
	return Input{Path: input, Remote: httpRemote{http.DefaultClient}}, nil
}

// httpRemote reads shards over HTTP(S) (loader.Remote): Open is a GET, ReadRange a GET
// with a Range header (a server that ignores it is read up to the range and the rest
// dropped).
type httpRemote struct{ c *http.Client }

func (h httpRemote) List(context.Context, string) ([]string, error) {
	return nil, errors.New("pipeline: http(s) inputs cannot be listed: name the shards")
}

func (h httpRemote) get(ctx context.Context, url, rng string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	resp, err := h.c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return resp, nil
}

func (h httpRemote) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	resp, err := h.get(ctx, url, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

func (h httpRemote) ReadRange(ctx context.Context, url string, off, n int64) ([]byte, error) {
	resp, err := h.get(ctx, url, fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK { // the whole object: skip to the range
		if _, err := io.CopyN(io.Discard, resp.Body, off); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(resp.Body, n))
}
