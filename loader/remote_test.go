package loader

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// memRemote is an in-memory Remote that counts what it serves.
type memRemote struct {
	mu      sync.Mutex
	objs    map[string][]byte
	opens   int
	ranges  int
	maxRead int64 // largest ranged read
}

func (m *memRemote) List(_ context.Context, prefix string) ([]string, error) {
	var out []string
	for k := range m.objs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out, nil
}

func (m *memRemote) Open(_ context.Context, key string) (io.ReadCloser, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[key]
	if !ok {
		return nil, errors.New("no such key " + key)
	}
	m.opens++
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (m *memRemote) ReadRange(_ context.Context, key string, off, n int64) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[key]
	if !ok {
		return nil, errors.New("no such key " + key)
	}
	m.ranges++
	m.maxRead = max(m.maxRead, n)
	end := min(off+n, int64(len(b)))
	return append([]byte(nil), b[min(off, end):end]...), nil
}

// TestRemoteShards reads WebDataset shards from a Remote: a key, a prefix, a
// brace pattern; plain and gzip; each image re-read with one ranged read of
// its own size (a .tar.gz shard through one inflated copy); a truncated
// object quarantined as broken_tar.
func TestRemoteShards(t *testing.T) {
	shard := func(p string) []byte {
		var ms []member
		for k := range 3 {
			key := p + string(rune('0'+k))
			ms = append(ms, member{key + ".jpg", strings.Repeat(key, 100)}, member{key + ".txt", "caption " + key})
		}
		return tarBytes(t, ms)
	}
	r := &memRemote{objs: map[string][]byte{
		"ds/a-000.tar":    shard("a"),
		"ds/a-001.tar.gz": gzBytes(t, shard("b")),
		"ds/readme.md":    []byte("not a shard"),
		"other/c.tar":     shard("c"),
		"cut/d.tar":       shard("d")[:2100],
	}}
	tests := []struct {
		path, ids, broken string
	}{
		{"ds", "a0,a1,a2,b0,b1,b2", ""},
		{"ds/", "a0,a1,a2,b0,b1,b2", ""},
		{"ds/a-{000.tar,001.tar.gz}", "a0,a1,a2,b0,b1,b2", ""},
		{"other/c.tar", "c0,c1,c2", ""},
		{"cut/d.tar", "d0", "unexpected EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			var rejects []Reject
			ix, err := BuildIndex(context.Background(), tt.path, Options{Remote: r, SpoolDir: t.TempDir(),
				OnReject: func(rj Reject) { rejects = append(rejects, rj) }})
			if err != nil {
				t.Fatal(err)
			}
			defer ix.Close()
			var got []string
			for _, e := range ix.All() {
				got = append(got, e.ID)
				img, err := ix.ReadImage(e)
				if err != nil || string(img) != strings.Repeat(e.ID, 100) {
					t.Errorf("%s: read %q, %v", e.ID, img, err)
				}
			}
			if g := strings.Join(got, ","); g != tt.ids {
				t.Errorf("ids %s, want %s", g, tt.ids)
			}
			if tt.broken != "" && !hasReject(rejects, ReasonBrokenTar, tt.broken) {
				t.Errorf("no broken_tar reject with %q: %+v", tt.broken, rejects)
			}
		})
	}
	if r.maxRead > 200 {
		t.Errorf("largest ranged read %d bytes, want one image (200)", r.maxRead)
	}
	if _, err := Open("ds/readme.md", Options{Remote: r}); !errors.Is(err, ErrNoData) {
		t.Errorf("a non-shard key: got %v, want ErrNoData", err)
	}
	if _, err := Open("ds/x.tar", Options{Remote: r, Format: FormatJSONL}); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("a manifest on a Remote: got %v, want ErrUnknownFormat", err)
	}
	src, err := Open("ds/a-{000..001}.tar", Options{Remote: r})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if _, err := Scan(context.Background(), src); err == nil || !strings.Contains(err.Error(), "ds/a-001.tar") {
		t.Errorf("a missing shard key: got %v, want an error naming it", err)
	}
	if _, err := Open("nothing", Options{Remote: r}); !errors.Is(err, ErrNoData) {
		t.Errorf("an empty prefix: got %v, want ErrNoData", err)
	}
}

// hangRemote serves objects whose bytes never arrive: a read blocks until the
// context the object was opened with is done.
type hangRemote struct{ memRemote }

type hangReader struct{ ctx context.Context }

func (h hangReader) Read([]byte) (int, error) { <-h.ctx.Done(); return 0, h.ctx.Err() }
func (h hangReader) Close() error             { return nil }

func (h *hangRemote) Open(ctx context.Context, _ string) (io.ReadCloser, error) {
	return hangReader{ctx}, nil
}

// TestRemoteReadIsCancellable: a shard whose bytes stall does not hang Next:
// the caller's deadline aborts the blocked read.
func TestRemoteReadIsCancellable(t *testing.T) {
	for _, key := range []string{"s.tar", "s.tar.gz"} {
		t.Run(key, func(t *testing.T) {
			var rejects []Reject
			src, err := Open(key, Options{Remote: &hangRemote{}, OnReject: func(r Reject) { rejects = append(rejects, r) }})
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			done := make(chan error, 1)
			go func() { _, err := src.Next(ctx); done <- err }()
			select {
			case err := <-done:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Next: got %v, want context.DeadlineExceeded", err)
				}
				if len(rejects) != 0 {
					t.Errorf("a cancelled read quarantined %+v, want nothing", rejects)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Next still blocked 10 s after its deadline")
			}
		})
	}
}

// FuzzRemoteTar feeds arbitrary bytes as a remote (unseekable) shard.
func FuzzRemoteTar(f *testing.F) {
	f.Add(tarBytes(f, []member{{"1.jpg", "i"}, {"1.txt", "t"}, {"2.json", `{"caption":"c"}`}, {"2.png", "p"}}), false)
	f.Add(tarBytes(f, []member{{"x.jpg", "i"}})[:700], false)
	f.Add(gzBytes(f, tarBytes(f, []member{{"1.jpg", "i"}, {"1.txt", "t"}})), true)
	f.Fuzz(func(t *testing.T, data []byte, gz bool) {
		key := "f.tar"
		if gz {
			key = "f.tar.gz"
		}
		r := &memRemote{objs: map[string][]byte{key: data}}
		src, err := Open(key, Options{Remote: r, MaxImageBytes: 1 << 16, MaxCaptionBytes: 1 << 16})
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		n := 0
		for {
			s, err := src.Next(context.Background())
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("Next: %v", err)
			}
			if len(s.Image) == 0 || CheckCaption(s.Text) != "" {
				t.Errorf("emitted a bad sample %+v", s)
			}
			n++
		}
		if st := src.Stats(); st.Seen != st.Emitted+st.Quarantined || st.Emitted != int64(n) {
			t.Errorf("stats %+v, emitted %d", st, n)
		}
	})
}
