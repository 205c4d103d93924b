package loader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/mmfeed/mmfeed/loader/synth"
)

// synthCorpus writes a small synthetic corpus and returns its summary.
func synthCorpus(t testing.TB, format string, n int, bad float64) synth.Summary {
	t.Helper()
	sum, err := synth.Generate(context.Background(), synth.Config{
		Out: t.TempDir(), Samples: n, Seed: 7, Format: format, ShardSize: 40,
		BadFraction: bad, MaxSide: 96})
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// TestIndexReadImageMatchesNext checks, for every source kind, that Scan
// gives the same entries as Next and ReadImage/ReadHeader the same bytes.
func TestIndexReadImageMatchesNext(t *testing.T) {
	pq := filepath.Join(t.TempDir(), "p.parquet")
	var rows []pqRow
	for i := range 25 {
		rows = append(rows, pqRow{id: "p" + strings.Repeat("x", i), img: ptr(strings.Repeat("I", i+1)), text: ptr("caption")})
	}
	writeParquet(t, pq, rows, true, 4)
	folder := t.TempDir()
	for _, k := range []string{"a", "b", "c"} {
		writeFile(t, filepath.Join(folder, k+".png"), []byte("png-"+k))
		writeFile(t, filepath.Join(folder, k+".txt"), []byte("caption "+k))
	}
	tests := []struct{ name, path string }{
		{"jsonl", synthCorpus(t, "jsonl", 60, 0.2).Path},
		{"wds", synthCorpus(t, "wds", 60, 0.2).Path},
		{"parquet", pq},
		{"folder", folder},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := drain(t, tt.path, Options{})
			ix, err := BuildIndex(context.Background(), tt.path, Options{})
			must(t, err)
			defer ix.Close()
			if ix.Len() != len(d.samples) {
				t.Fatalf("index has %d entries, Next gave %d", ix.Len(), len(d.samples))
			}
			checkInvariant(t, ix.Stats, ix.Len(), int(ix.Stats.Quarantined))
			for i, e := range ix.All() {
				s := d.samples[i]
				img, err := ix.ReadImage(e)
				must(t, err)
				hdr, err := ix.ReadHeader(e, 8)
				must(t, err)
				if e.ID != s.ID || e.Location != s.Location || e.Text != s.Text || !bytes.Equal(img, s.Image) ||
					e.ImageSize != int64(len(s.Image)) || !bytes.HasPrefix(s.Image, hdr) || len(hdr) != min(8, len(s.Image)) {
					t.Fatalf("entry %d %+v differs from sample %s/%s (%d bytes)", i, e, s.ID, s.Location, len(s.Image))
				}
			}
		})
	}
}

func TestIndexDuplicatesAndStale(t *testing.T) {
	manifest := manifestFixture(t, []string{
		`{"image":"img/ok.jpg","text":"one","id":"a"}`,
		`{"image":"img/ok.jpg","text":"one again","id":"a"}`,
		`{"image":"img/ok.jpg","text":"same line"}`,
		`{"image":"img/ok.jpg","text":"same line"}`,
		`{"image":"img/missing.jpg","text":"gone"}`,
	})
	q := NewQuarantineWriter(nil)
	ix, err := BuildIndex(context.Background(), manifest, Options{OnReject: q.Func()})
	must(t, err)
	if ix.Len() != 2 {
		t.Fatalf("got %d entries, want 2", ix.Len())
	}
	if got, want := q.Counts()[ReasonDuplicateID], int64(2); got != want {
		t.Errorf("duplicate rejects: got %d, want %d", got, want)
	}
	checkInvariant(t, ix.Stats, ix.Len(), int(q.Total()))
	if ix.Stats.Seen != 5 {
		t.Errorf("seen: got %d, want 5", ix.Stats.Seen)
	}
	img := filepath.Join(filepath.Dir(manifest), "img", "ok.jpg")
	must(t, os.WriteFile(img, []byte("changed size"), 0o644))
	if _, err := ix.ReadImage(ix.Entry(0)); !errors.Is(err, ErrStale) {
		t.Errorf("ReadImage after change: got %v, want ErrStale", err)
	}
}

// TestInvariantBadCorpus checks emitted + quarantined = seen, with the
// reasons synth promised, on corpora full of bad samples.
func TestInvariantBadCorpus(t *testing.T) {
	for _, format := range []string{"jsonl", "wds"} {
		t.Run(format, func(t *testing.T) {
			sum := synthCorpus(t, format, 300, 0.5)
			var buf bytes.Buffer
			q := NewQuarantineWriter(&buf)
			d := drain(t, sum.Path, Options{OnReject: q.Func()})
			want := map[string]int64{}
			for _, b := range sum.Bad {
				if r := b.LoaderReason(); r != "" {
					want[r]++
				}
			}
			if got := d.stats.Seen; got != int64(sum.Samples) {
				t.Errorf("seen: got %d, want %d", got, sum.Samples)
			}
			for r, n := range want {
				if got := q.Counts()[r]; got != n {
					t.Errorf("reason %s: got %d, want %d", r, got, n)
				}
			}
			rs, err := ReadQuarantine(&buf)
			must(t, err)
			if int64(len(rs)) != d.stats.Quarantined || len(want) == 0 {
				t.Errorf("quarantine.jsonl has %d lines, stats say %d (want reasons %v)", len(rs), d.stats.Quarantined, want)
			}
		})
	}
}

func TestQuarantineWriterConcurrent(t *testing.T) {
	var buf bytes.Buffer
	q := NewQuarantineWriter(&buf)
	var wg sync.WaitGroup
	reasons := []string{ReasonMissingImage, "decode_error", ReasonEmptyCaption}
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				must(t, q.Write(Reject{ID: "x", Location: "l", Reason: reasons[(g+i)%3], Detail: "d\n\"quoted\""}))
			}
		})
	}
	wg.Wait()
	rs, err := ReadQuarantine(&buf)
	must(t, err)
	if len(rs) != 800 || q.Total() != 800 {
		t.Fatalf("got %d lines, total %d, want 800", len(rs), q.Total())
	}
	var sum int64
	for _, n := range q.Counts() {
		sum += n
	}
	if sum != 800 || rs[0].Detail != "d\n\"quoted\"" {
		t.Errorf("counts sum %d, first detail %q", sum, rs[0].Detail)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestQuarantineWriterError(t *testing.T) {
	q := NewQuarantineWriter(failWriter{})
	q.Func()(Reject{Reason: "x"})
	if q.Err() == nil || q.Total() != 1 {
		t.Errorf("got err %v total %d, want an error and total 1", q.Err(), q.Total())
	}
}

func TestIndexConcurrentReads(t *testing.T) {
	pq := filepath.Join(t.TempDir(), "p.parquet")
	var rows []pqRow
	for i := range 40 {
		rows = append(rows, pqRow{id: strings.Repeat("i", i+1), img: ptr(strings.Repeat("x", i+1)), text: ptr("t")})
	}
	writeParquet(t, pq, rows, false, 5)
	ix, err := BuildIndex(context.Background(), pq, Options{})
	must(t, err)
	defer ix.Close()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for _, e := range ix.Order(uint64(g), 0) {
				img, err := ix.ReadImage(e)
				if err != nil || len(img) != len(e.ID) {
					t.Errorf("%s: got %d bytes, err %v", e.ID, len(img), err)
				}
			}
		})
	}
	wg.Wait()
}

func TestContextCanceled(t *testing.T) {
	sum := synthCorpus(t, "wds", 10, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	src, err := Open(sum.Path, Options{})
	must(t, err)
	defer src.Close()
	if _, err := src.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Next on canceled ctx: got %v, want context.Canceled", err)
	}
	if _, err := Scan(ctx, src); !errors.Is(err, context.Canceled) {
		t.Errorf("Scan on canceled ctx: got %v, want context.Canceled", err)
	}
}

// TestReadTooLargeSaysSizeAndLimit: an entry over MaxImageBytes at re-read
// names its size and the limit.
func TestReadTooLargeSaysSizeAndLimit(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.jpg"), []byte("0123456789"))
	writeFile(t, filepath.Join(dir, "a.txt"), []byte("caption"))
	ix, err := BuildIndex(context.Background(), dir, Options{})
	must(t, err)
	ix.opts.MaxImageBytes = 4
	_, err = ix.ReadImage(ix.Entry(0))
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "10 bytes > max 4") {
		t.Errorf("got %v, want ErrTooLarge naming 10 bytes > max 4", err)
	}
}

func TestIndexHoldsNoSpareCapacity(t *testing.T) {
	for _, n := range []int{1, 5, 1000, 20000} {
		t.Run(fmt.Sprintf("entries=%d", n), func(t *testing.T) {
			lines := make([]string, n)
			for i := range lines {
				lines[i] = fmt.Sprintf(`{"image":"img/ok.jpg","text":"caption %d","id":"s%d"}`, i, i)
			}
			ix, err := BuildIndex(context.Background(), manifestFixture(t, lines), Options{})
			must(t, err)
			// the allocator rounds a large slice up to its page size (8 KiB), no more
			p := ix.packed
			if p == nil {
				t.Fatal("a manifest's index keeps its entries whole, want packed")
			}
			spare := (cap(p.recs)-len(p.recs))*int(unsafe.Sizeof(packedRec{})) + (cap(p.idEnd)-len(p.idEnd))*4 + cap(p.ids) - len(p.ids)
			if ix.Len() != n || spare > 3*8<<10 {
				t.Errorf("%d entries with %d spare bytes, want %d and at most 8 KiB spare per column", ix.Len(), spare, n)
			}
		})
	}
}

func TestManifestEntryKeepsTheLinesImagePath(t *testing.T) {
	manifest := manifestFixture(t, []string{
		`{"image":"img/ok.jpg","text":"one","id":"a"}`,
		`{"image":"img/./ok.jpg","text":"two","id":"b"}`,
	})
	ix, err := BuildIndex(context.Background(), manifest, Options{})
	must(t, err)
	want, err := os.ReadFile(filepath.Join(filepath.Dir(manifest), "img", "ok.jpg"))
	must(t, err)
	tests := []struct{ id, path string }{{"a", "img/ok.jpg"}, {"b", "img/ok.jpg"}}
	for i, tt := range tests {
		e := ix.Entry(i)
		if e.ID != tt.id || e.ref.path != tt.path {
			t.Errorf("entry %s keeps image path %q, want %q", e.ID, e.ref.path, tt.path)
		}
		img, err := ix.ReadImage(e)
		must(t, err)
		if !bytes.Equal(img, want) {
			t.Errorf("entry %s: read %d bytes, want the image's %d", e.ID, len(img), len(want))
		}
	}
	// the first line's path is its own string, the one ImageName is the tail of
	a := ix.Entry(0)
	if unsafe.Add(unsafe.Pointer(unsafe.StringData(a.ref.path)), len(a.ref.path)-len(a.ImageName)) != unsafe.Pointer(unsafe.StringData(a.ImageName)) {
		t.Error("the entry's image path and ImageName are separate strings")
	}
}

func TestIndexPacksEntryStrings(t *testing.T) {
	long := strings.Repeat("a long caption ", 100) // over arenaMax: keeps its own allocation
	entries := []Entry{
		{ID: "a", Location: "m.jsonl:1", Text: "one", ImageName: "ok.jpg", ref: imageRef{path: "img/ok.jpg"}},
		{ID: "bb", Location: "m.jsonl:2", Text: "two, a little longer", ImageName: "ok.jpg", ref: imageRef{path: "img/ok.jpg"}},
	}
	var a stringArena
	next := func(s string) unsafe.Pointer { return unsafe.Add(unsafe.Pointer(unsafe.StringData(s)), len(s)) }
	var end unsafe.Pointer
	for i, e := range entries {
		e = a.entry(e)
		seq := []string{e.ID, e.Location, e.Text, e.ImageName, e.ref.path}
		for j := 1; j < len(seq); j++ {
			if unsafe.Pointer(unsafe.StringData(seq[j])) != next(seq[j-1]) {
				t.Errorf("entry %d: string %d (%q) does not follow %q in the arena", i, j, seq[j], seq[j-1])
			}
		}
		if end != nil && unsafe.Pointer(unsafe.StringData(e.ID)) != end {
			t.Errorf("entry %d does not follow the entry before it in the arena", i)
		}
		end = next(e.ref.path)
	}
	if got := a.entry(Entry{Text: long}); unsafe.StringData(got.Text) != unsafe.StringData(long) {
		t.Error("a long caption was copied into the arena")
	}
}
