package loader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// checkEntriesEqualNext checks that every entry of the index of path,
// materialised one at a time and as a range, is what Next gives: the same
// id, location, caption (byte for byte), image name, size and image bytes.
// packedWant says what form the index must take: packed, whole, or
// either (a fuzzed input).
type packedWant int

const (
	wantWhole packedWant = iota
	wantPacked
	wantEither
)

func checkEntriesEqualNext(t testing.TB, path string, opts Options, want packedWant) {
	t.Helper()
	d := drain(t, path, opts)
	seen := map[string]bool{}
	var samples []Sample
	for _, s := range d.samples { // the index quarantines a repeated id
		if !seen[s.ID] {
			seen[s.ID] = true
			samples = append(samples, s)
		}
	}
	d.samples = samples
	ix, err := BuildIndex(context.Background(), path, opts)
	must(t, err)
	defer ix.Close()
	if got := ix.packed != nil; want != wantEither && got != (want == wantPacked) {
		t.Fatalf("index packed %v, want %v", got, want == wantPacked)
	}
	if ix.Len() != len(d.samples) {
		t.Fatalf("index has %d entries, Next gave %d", ix.Len(), len(d.samples))
	}
	all := ix.All()
	for i, s := range d.samples {
		for _, e := range []Entry{ix.Entry(i), all[i]} {
			if e.ID != s.ID || ix.ID(i) != s.ID || e.Location != s.Location || e.Text != s.Text ||
				e.ImageName != s.ImageName || e.ImageSize != int64(len(s.Image)) {
				t.Fatalf("entry %d {%q %q %q %q %d} differs from Next's {%q %q %q %q %d}", i,
					e.ID, e.Location, e.Text, e.ImageName, e.ImageSize, s.ID, s.Location, s.Text, s.ImageName, len(s.Image))
			}
			img, err := ix.ReadImage(e)
			if err != nil || !bytes.Equal(img, s.Image) {
				t.Fatalf("entry %d: image %q, %v; Next gave %q", i, img, err, s.Image)
			}
		}
	}
}

// A manifest's packed index re-reads each line: what it materialises is
// what Next gives, for every shape of line.
func TestPackedManifestEntriesEqualNext(t *testing.T) {
	long := strings.Repeat("a long caption ", 200)
	tests := []struct {
		name  string
		lines []string
		opts  Options
	}{
		{"plain", []string{`{"image":"img/ok.jpg","text":"one","id":"a"}`, `{"image":"img/big.jpg","text":"two","id":"b"}`}, Options{}},
		{"derived ids", []string{`{"image":"img/ok.jpg","text":"one"}`, `{"image":"img/big.jpg","caption":"two"}`}, Options{}},
		{"numeric id", []string{`{"image":"img/ok.jpg","text":"one","id":17}`, `{"image":"img/ok.jpg","text":"x","id":1.5e3}`}, Options{}},
		{"escapes and unicode", []string{`{"image":"img/ok.jpg","text":"caf\u00e9 \"q\" \\ \n tab\t","id":"é"}`, `{"image":"img/ok.jpg","text":"日本語 caption 🐈","id":"ü"}`}, Options{}},
		{"byte order mark", []string{"\xef\xbb\xbf" + `{"image":"img/ok.jpg","text":"one","id":"a"}`, `{"image":"img/ok.jpg","text":"two","id":"b"}`}, Options{}},
		{"crlf and blank lines", []string{`{"image":"img/ok.jpg","text":"one","id":"a"}` + "\r", "", "   ", `{"image":"img/ok.jpg","text":"two","id":"b"}` + "\r"}, Options{}},
		{"rejects between", []string{`{"image":"img/ok.jpg","text":"one","id":"a"}`, `not json`, `{"image":"img/zero.jpg","text":"z","id":"z"}`, `{"image":"img/ok.jpg","text":"  ","id":"e"}`, `{"image":"img/ok.jpg","text":"two","id":"a"}`, `{"image":"img/ok.jpg","text":"three","id":"c"}`}, Options{}},
		{"long caption", []string{`{"image":"img/ok.jpg","text":"` + long + `","id":"a"}`}, Options{}},
		{"unclean and linked paths", []string{`{"image":"img/./ok.jpg","text":"one","id":"a"}`, `{"image":"img/inside.jpg","text":"two","id":"b"}`, `{"image":"img//big.jpg","text":"three","id":"c"}`}, Options{}},
		{"named fields", []string{`{"media":{"path":"img/ok.jpg"},"alt":"one","key":"a"}`, `{"media":{"path":"img/big.jpg"},"alt":"two","key":"b"}`},
			Options{ImageColumn: "media.path", TextColumn: "alt", IDColumn: "key"}},
		{"no final newline", []string{`{"image":"img/ok.jpg","text":"one","id":"a"}`, `{"image":"img/ok.jpg","text":"last","id":"b"}`}, Options{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkEntriesEqualNext(t, manifestFixture(t, tt.lines), tt.opts, wantPacked)
		})
	}
	t.Run("absolute path", func(t *testing.T) {
		img := filepath.Join(t.TempDir(), "abs.jpg")
		writeFile(t, img, []byte("absolute"))
		line := fmt.Sprintf(`{"image":%q,"text":"one","id":"a"}`, img)
		checkEntriesEqualNext(t, manifestFixture(t, []string{line}), Options{AllowAbsolute: true}, wantPacked)
	})
	t.Run("webdataset shards", func(t *testing.T) {
		checkEntriesEqualNext(t, synthCorpus(t, "wds", 90, 0.2).Path, Options{}, wantPacked)
	})
	t.Run("glob of manifests", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "img", "a.jpg"), []byte("aaa"))
		writeFile(t, filepath.Join(dir, "m1.jsonl"), []byte(`{"image":"img/a.jpg","text":"one"}`+"\n"+`{"image":"img/a.jpg","text":"two"}`+"\n"))
		writeFile(t, filepath.Join(dir, "m2.jsonl"), []byte(`{"image":"img/a.jpg","text":"three"}`+"\n"))
		checkEntriesEqualNext(t, filepath.Join(dir, "m*.jsonl"), Options{}, wantPacked)
	})
}

// Every other source kind keeps its entries whole, and they too equal Next.
func TestWholeIndexEntriesEqualNext(t *testing.T) {
	pq := filepath.Join(t.TempDir(), "p.parquet")
	var rows []pqRow
	for i := range 9 {
		rows = append(rows, pqRow{id: fmt.Sprint("p", i), img: ptr(strings.Repeat("I", i+1)), text: ptr(fmt.Sprint("caption ", i))})
	}
	writeParquet(t, pq, rows, true, 4)
	hf := t.TempDir()
	writeHFDisk(t, hf, [][][]hfRow{{hfRows("a", 3), hfRows("b", 2)}})
	folder := t.TempDir()
	for _, k := range []string{"a", "b"} {
		writeFile(t, filepath.Join(folder, k+".png"), []byte("png-"+k))
		writeFile(t, filepath.Join(folder, k+".txt"), []byte("caption "+k))
	}
	gz := filepath.Join(t.TempDir(), "s.tar.gz")
	writeFile(t, gz, gzBytes(t, tarBytes(t, []member{{name: "k1.jpg", data: "img1"}, {name: "k1.txt", data: "cap one"},
		{name: "k2.jpg", data: "img2"}, {name: "k2.txt", data: "cap two"}})))
	tests := []struct{ name, path, text string }{
		{"wds gz", gz, ""},
		{"parquet", pq, ""},
		{"arrow", hf, "caption"},
		{"folder", folder, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkEntriesEqualNext(t, tt.path, Options{SpoolDir: t.TempDir(), TextColumn: tt.text}, wantWhole)
		})
	}
}

// A line that changed after indexing materialises a stale entry: its
// image reads fail with ErrStale; the lines that did not change still read.
func TestPackedEntryOfAChangedLineIsStale(t *testing.T) {
	lines := []string{`{"image":"img/ok.jpg","text":"first","id":"a"}`, `{"image":"img/ok.jpg","text":"other","id":"b"}`,
		`{"image":"img/ok.jpg","text":"third","id":"c"}`}
	tests := []struct {
		name   string
		change func(string) string
		want   []error // each entry's read error: nil, ErrStale, or what reading the record failed with
	}{
		{"same length caption", func(s string) string { return strings.Replace(s, "other", "OTHER", 1) }, []error{nil, ErrStale, nil}},
		{"same length id", func(s string) string { return strings.Replace(s, `"id":"b"`, `"id":"x"`, 1) }, []error{nil, ErrStale, nil}},
		{"lines moved", func(s string) string { return "\n" + s }, []error{ErrStale, ErrStale, ErrStale}},
		{"file cut short", func(s string) string { return s[:len(s)/2] }, []error{nil, ErrStale, ErrStale}},
		{"file removed", nil, []error{nil, nil, nil}}, // the index holds the manifest open
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			manifest := manifestFixture(t, lines)
			ix, err := BuildIndex(context.Background(), manifest, Options{})
			must(t, err)
			b, err := os.ReadFile(manifest)
			must(t, err)
			if tt.change == nil {
				must(t, os.Remove(manifest))
			} else {
				writeFile(t, manifest, []byte(tt.change(string(b))))
			}
			for i, e := range ix.All() {
				_, err := ix.ReadImage(e)
				if (err == nil) != (tt.want[i] == nil) || (err != nil && !errors.Is(err, tt.want[i])) {
					t.Errorf("entry %d (%s): read error %v, want %v", i, e.ID, err, tt.want[i])
				}
				if e.ID != ix.ID(i) || e.Location != fmt.Sprintf("%s:%d", manifest, i+1) {
					t.Errorf("entry %d: id %q location %q, want the indexed ones", i, e.ID, e.Location)
				}
			}
		})
	}
}

// A packed index holds its manifest open until Close; after that a read
// opens it again, by path.
func TestPackedIndexHoldsItsManifest(t *testing.T) {
	manifest := manifestFixture(t, []string{`{"image":"img/ok.jpg","text":"first","id":"a"}`})
	ix, err := BuildIndex(context.Background(), manifest, Options{})
	must(t, err)
	must(t, os.Rename(manifest, manifest+".old"))
	writeFile(t, manifest, []byte(`{"image":"img/ok.jpg","text":"FIRST","id":"a"}`))
	if e := ix.Entry(0); e.Text != "first" {
		t.Errorf("replaced manifest: caption %q, want the indexed line's", e.Text)
	}
	must(t, ix.Close())
	if _, err := ix.ReadImage(ix.Entry(0)); !errors.Is(err, ErrStale) {
		t.Errorf("after Close, the replaced line reads with error %v, want ErrStale", err)
	}
	must(t, os.Remove(manifest))
	if _, err := ix.ReadImage(ix.Entry(0)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Close, the removed manifest reads with error %v, want ErrNotExist", err)
	}
}

// A manifest's index holds its entries in well under 100 bytes each,
// whatever the caption length: the captions are re-read, not kept.
func TestPackedIndexKeepsNoCaptions(t *testing.T) {
	const n = 20000
	caption := strings.Repeat("x", 300)
	var sb strings.Builder
	for i := range n {
		fmt.Fprintf(&sb, `{"image":"img/ok.jpg","text":"%s %d","id":"s%07d"}`+"\n", caption, i, i)
	}
	manifest := manifestFixture(t, nil)
	writeFile(t, manifest, []byte(sb.String()))
	sb = strings.Builder{}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	ix, err := BuildIndex(context.Background(), manifest, Options{})
	must(t, err)
	after := heap()
	if ix.Len() != n {
		t.Fatalf("%d entries, want %d", ix.Len(), n)
	}
	per := (float64(after) - float64(before)) / n
	if per > 100 {
		t.Errorf("the index holds %.0f bytes per entry, want at most 100 (captions of %d bytes)", per, len(caption))
	}
	if got := ix.EntryBytes() / n; got > 36 {
		t.Errorf("the columns hold %d bytes per entry, want 36", got)
	}
	runtime.KeepAlive(ix)
}

// FuzzPackedManifestRereads: whatever the manifest's bytes, the packed
// index materialises what Next gives.
func FuzzPackedManifestRereads(f *testing.F) {
	f.Add([]byte(`{"image":"img/ok.jpg","text":"one","id":"a"}` + "\n" + `{"image":"img/big.jpg","text":"two"}`))
	f.Add([]byte("\xef\xbb\xbf" + `{"image":"img/ok.jpg","text":"x\u00e9"}` + "\r\n\n" + `{"image":"img/./ok.jpg","caption":"c","id":3}`))
	f.Add([]byte(`{"image":"img/inside.jpg","text":"t","id":"a"}` + "\n" + `{"image":"img/ok.jpg","text":"t","id":"a"}` + "\nnot json\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		manifest := manifestFixture(t, nil)
		writeFile(t, manifest, data)
		checkEntriesEqualNext(t, manifest, Options{}, wantPacked)
	})
}

// A local WebDataset shard's packed index re-reads each caption member:
// what it materialises is what Next gives, whichever member the caption
// came from.
func TestPackedWDSEntriesEqualNext(t *testing.T) {
	tests := []struct {
		name    string
		members []member
		opts    Options
	}{
		{"txt captions", []member{{"a.jpg", "img-a"}, {"a.txt", "cap a"}, {"b.png", "img-b"}, {"b.txt", "cap b"}}, Options{}},
		{"json field caption and id", []member{{"a.jpg", "img-a"}, {"a.json", `{"caption":"from json","id":"ID-a"}`},
			{"b.jpg", "img-b"}, {"b.json", `{"caption":"b \u00e9","id":7}`}}, Options{WDSTextKeys: "json:caption"}},
		{"first text key wins", []member{{"a.jpg", "img-a"}, {"a.json", `{"caption":"json"}`}, {"a.txt", "txt"},
			{"b.jpg", "img-b"}, {"b.json", `{"caption":"only json"}`}}, Options{WDSTextKeys: "txt;json:caption"}},
		{"dirs, dots and case", []member{{"d/x/k1.JPG", "img-1"}, {"d/x/k1.TXT", "one"}, {"d/k2.seg.png", "img-2"}, {"d/k2.txt", "two"}}, Options{}},
		{"rejects between", []member{{"a.jpg", "img-a"}, {"a.txt", "cap a"}, {"n.jpg", "no caption"}, {"e.jpg", "x"}, {"e.txt", "  "},
			{"c.jpg", "img-c"}, {"c.txt", "cap c"}}, Options{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			shard := filepath.Join(t.TempDir(), "s.tar")
			writeFile(t, shard, tarBytes(t, tt.members))
			checkEntriesEqualNext(t, shard, tt.opts, wantPacked)
		})
	}
}

// A caption member that changed after indexing materialises stale.
func TestPackedWDSChangedCaptionIsStale(t *testing.T) {
	shard := filepath.Join(t.TempDir(), "s.tar")
	writeFile(t, shard, tarBytes(t, []member{{"a.jpg", "img-a"}, {"a.txt", "cap a"}, {"b.jpg", "img-b"}, {"b.txt", "cap b"}}))
	ix, err := BuildIndex(context.Background(), shard, Options{})
	must(t, err)
	writeFile(t, shard, tarBytes(t, []member{{"a.jpg", "img-a"}, {"a.txt", "cap a"}, {"b.jpg", "img-b"}, {"b.txt", "CAP B"}}))
	for i, want := range []error{nil, ErrStale} {
		if _, err := ix.ReadImage(ix.Entry(i)); (err == nil) != (want == nil) || (err != nil && !errors.Is(err, want)) {
			t.Errorf("entry %d: read error %v, want %v", i, err, want)
		}
	}
}

// FuzzPackedWDSRereads: whatever the shard's bytes, the index (packed when
// the shard reads) materialises what Next gives; the text keys take
// captions from .txt members and from a .json member's field.
func FuzzPackedWDSRereads(f *testing.F) {
	f.Add(tarBytes(f, []member{{"a.jpg", "img-a"}, {"a.txt", "cap a"}, {"b.jpg", "img-b"}, {"b.json", `{"caption":"b","id":"x"}`}}))
	f.Add(tarBytes(f, []member{{"d/k.seg.PNG", "img"}, {"d/k.json", `{"caption":{"x":1}}`}, {"d/k.txt", "t"}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		shard := filepath.Join(t.TempDir(), "s.tar")
		writeFile(t, shard, data)
		checkEntriesEqualNext(t, shard, Options{WDSTextKeys: "txt;json:caption"}, wantEither)
	})
}

// Entries materialise concurrently (workers preprocess in parallel).
func TestPackedEntriesConcurrently(t *testing.T) {
	for _, path := range []string{synthCorpus(t, "jsonl", 80, 0.1).Path, synthCorpus(t, "wds", 80, 0.1).Path} {
		ix, err := BuildIndex(context.Background(), path, Options{})
		must(t, err)
		want := ix.All()
		errc := make(chan error, 8)
		for g := range 8 {
			go func() {
				for i := range want {
					j := (i + g*11) % len(want)
					if e := ix.Entry(j); e != want[j] {
						errc <- fmt.Errorf("entry %d: %+v, want %+v", j, e, want[j])
						return
					}
					if _, err := ix.ReadImage(want[j]); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
		}
		for range 8 {
			if err := <-errc; err != nil {
				t.Error(err)
			}
		}
		must(t, ix.Close())
	}
}
