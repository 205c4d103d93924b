package loader

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// drainWithin drains like drain but fails (instead of hanging the test run)
// when the source blocks for longer than d.
func drainWithin(t *testing.T, d time.Duration, path string, opts Options) drained {
	t.Helper()
	done := make(chan drained, 1)
	go func() { done <- drain(t, path, opts) }()
	select {
	case got := <-done:
		return got
	case <-time.After(d):
		t.Fatalf("reading %s blocked for more than %v", path, d)
		return drained{}
	}
}

func mkfifo(t *testing.T, p string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
}

func symlink(t *testing.T, target, p string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.Symlink(target, p))
}

// TestFolderHostile: links out of the folder, pipes and devices are
// quarantined with their reason, never read, never waited on; links that
// stay inside work.
func TestFolderHostile(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "data")
	outside := filepath.Join(root, "secret")
	writeFile(t, filepath.Join(outside, "pw.txt"), []byte("the secret password"))
	writeFile(t, filepath.Join(outside, "img.jpg"), []byte("secret image"))
	writeFile(t, filepath.Join(outside, "deep", "x.jpg"), []byte("img"))
	writeFile(t, filepath.Join(outside, "deep", "x.txt"), []byte("deep caption"))

	writeFile(t, filepath.Join(dir, "ok.jpg"), []byte("img"))
	writeFile(t, filepath.Join(dir, "ok.txt"), []byte("fine"))
	writeFile(t, filepath.Join(dir, "real", "in.txt"), []byte("linked inside"))
	writeFile(t, filepath.Join(dir, "capout.jpg"), []byte("img"))
	symlink(t, filepath.Join(outside, "pw.txt"), filepath.Join(dir, "capout.txt"))
	symlink(t, filepath.Join(outside, "img.jpg"), filepath.Join(dir, "imgout.jpg"))
	writeFile(t, filepath.Join(dir, "imgout.txt"), []byte("caption"))
	writeFile(t, filepath.Join(dir, "capin.jpg"), []byte("img"))
	symlink(t, "real/in.txt", filepath.Join(dir, "capin.txt"))
	writeFile(t, filepath.Join(dir, "zero.jpg"), []byte("img"))
	symlink(t, "/dev/zero", filepath.Join(dir, "zero.txt"))
	writeFile(t, filepath.Join(dir, "dangling.jpg"), []byte("img"))
	symlink(t, filepath.Join(root, "nothing"), filepath.Join(dir, "dangling.txt"))
	symlink(t, filepath.Join(outside, "deep"), filepath.Join(dir, "linkdir")) // not descended
	writeFile(t, filepath.Join(dir, "fifocap.jpg"), []byte("img"))
	mkfifo(t, filepath.Join(dir, "fifocap.txt"))
	mkfifo(t, filepath.Join(dir, "fifoimg.jpg"))
	writeFile(t, filepath.Join(dir, "fifoimg.txt"), []byte("caption"))
	writeFile(t, filepath.Join(dir, "big.jpg"), []byte("img"))
	writeFile(t, filepath.Join(dir, "big.txt"), []byte(strings.Repeat("x", 200)))

	want := map[string]string{
		"capout.jpg":   ReasonEscapesRoot,
		"imgout.jpg":   ReasonEscapesRoot,
		"zero.jpg":     ReasonEscapesRoot,
		"dangling.jpg": ReasonMissingCaption,
		"fifocap.jpg":  ReasonNotRegular,
		"fifoimg.jpg":  ReasonNotRegular,
		"big.jpg":      ReasonTooLarge,
		"real/in":      ReasonMissingImage, // an orphan caption, read through no link
	}
	for _, scan := range []bool{false, true} {
		var d drained
		if scan {
			d = scanWithin(t, 10*time.Second, dir, Options{MaxCaptionBytes: 100})
		} else {
			d = drainWithin(t, 10*time.Second, dir, Options{MaxCaptionBytes: 100})
		}
		got := map[string]string{}
		for _, r := range d.rejects {
			got[r.ID] = r.Reason
		}
		for id, reason := range want {
			if got[id] != reason {
				t.Errorf("scan=%v %s: got reason %q, want %q", scan, id, got[id], reason)
			}
		}
		if len(got) != len(want) {
			t.Errorf("scan=%v: got rejects %v, want %v", scan, got, want)
		}
		texts := map[string]string{}
		for _, s := range d.samples {
			texts[s.ID] = s.Text
		}
		if len(texts) != 2 || texts["ok.jpg"] != "fine" || texts["capin.jpg"] != "linked inside" {
			t.Errorf("scan=%v: got samples %v, want ok.jpg and capin.jpg", scan, texts)
		}
	}
}

// scanWithin builds an Index (the planning path) and re-reads every image
// through it, failing when that blocks for longer than d.
func scanWithin(t *testing.T, d time.Duration, path string, opts Options) drained {
	t.Helper()
	done := make(chan drained, 1)
	go func() {
		var out drained
		opts.OnReject = func(r Reject) { out.rejects = append(out.rejects, r) }
		ix, err := BuildIndex(context.Background(), path, opts)
		if err != nil {
			t.Errorf("BuildIndex: %v", err)
			done <- out
			return
		}
		for i := range ix.All() {
			s, err := ix.Sample(i)
			if err != nil {
				t.Errorf("Sample(%d): %v", i, err)
			}
			out.samples = append(out.samples, s)
		}
		done <- out
	}()
	select {
	case got := <-done:
		return got
	case <-time.After(d):
		t.Fatalf("indexing %s blocked for more than %v", path, d)
		return drained{}
	}
}

// TestReadNeverBlocks: an indexed image replaced by a FIFO after the scan
// (a swap between check and use) fails the re-read at once.
func TestReadNeverBlocks(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.jpg"), []byte("img"))
	writeFile(t, filepath.Join(dir, "a.txt"), []byte("caption"))
	ix, err := BuildIndex(context.Background(), dir, Options{})
	must(t, err)
	must(t, os.Remove(filepath.Join(dir, "a.jpg")))
	mkfifo(t, filepath.Join(dir, "a.jpg"))
	errc := make(chan error, 1)
	go func() { _, err := ix.ReadImage(ix.Entry(0)); errc <- err }()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("got %v, want ErrNotRegular", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ReadImage blocked on a FIFO")
	}
}

// TestOpenRefusesNonRegular: a dataset file that is a pipe is an error at
// once, not a hang.
func TestOpenRefusesNonRegular(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"m.jsonl", "s.tar", "p.parquet", "a.arrow"} {
		p := filepath.Join(dir, name)
		mkfifo(t, p)
		errc := make(chan error, 1)
		go func() {
			src, err := Open(p, Options{})
			if err == nil {
				_, err = src.Next(context.Background())
				src.Close()
			}
			errc <- err
		}()
		select {
		case err := <-errc:
			if !errors.Is(err, ErrNotRegular) {
				t.Errorf("%s: got %v, want ErrNotRegular", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Open/Next blocked on a FIFO", name)
		}
	}
}

func TestReadFullCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := readFull(ctx, zeroReader{}, make([]byte, 3*readChunk))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) { clear(b); return len(b), nil }

func TestTarSlipNames(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.tar")
	writeFile(t, p, tarBytes(t, []member{
		{"../../etc/x.jpg", "i"}, {"../../etc/x.txt", "slip"},
		{"/abs/y.jpg", "i"}, {"/abs/y.txt", "abs"},
		{"ok/z.jpg", "i"}, {"ok/z.txt", "fine"},
	}))
	d := drain(t, p, Options{})
	got := reasonsByLoc(d.rejects)
	for _, key := range []string{"../../etc/x", "/abs/y"} {
		if r := got[p+":"+key]; r != ReasonEscapesRoot {
			t.Errorf("%s: got reason %q, want escapes_root", key, r)
		}
	}
	if len(d.samples) != 1 || d.samples[0].ID != "ok/z" {
		t.Errorf("got samples %v, want [ok/z]", ids(d.samples))
	}
}

func TestParquetHostile(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("w", 300)
	writeParquet(t, filepath.Join(dir, "a.parquet"), []pqRow{
		{id: "ok", img: ptr("img"), text: ptr("fine")},
		{id: "long", img: ptr("img"), text: ptr(long)},
	}, false, 10)
	writeParquet(t, filepath.Join(dir, "b.parquet"), []pqRow{
		{id: "big0", img: ptr(strings.Repeat("i", 3000)), text: ptr("x")},
		{id: "big1", img: ptr(strings.Repeat("j", 3000)), text: ptr("y")},
	}, false, 10)
	writeWrongTypes(t, filepath.Join(dir, "c.parquet"))
	writeFile(t, filepath.Join(dir, "d.parquet"), []byte("PAR1 garbage PAR1"))
	d := drain(t, dir, Options{MaxCaptionBytes: 100, MaxRowGroupBytes: 2000})
	got := reasonsByLoc(d.rejects)
	want := map[string]string{
		filepath.Join(dir, "a.parquet") + ":rg0:row1": ReasonTooLarge,
		filepath.Join(dir, "b.parquet") + ":rg0":      ReasonTooLarge,
		filepath.Join(dir, "c.parquet"):               ReasonBadParquetFile,
		filepath.Join(dir, "d.parquet"):               ReasonBadParquetFile,
	}
	for loc, reason := range want {
		if got[loc] != reason {
			t.Errorf("%s: got reason %q, want %q", loc, got[loc], reason)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got rejects %v, want %v", got, want)
	}
	if len(d.samples) != 1 || d.samples[0].ID != "ok" {
		t.Errorf("got samples %v, want [ok]", ids(d.samples))
	}
}

// writeWrongTypes writes a Parquet file whose image and text columns are
// integers.
func writeWrongTypes(t *testing.T, p string) {
	t.Helper()
	mem := memory.NewCheckedAllocator(memory.DefaultAllocator)
	defer mem.AssertSize(t, 0)
	sc := arrow.NewSchema([]arrow.Field{
		{Name: "image", Type: arrow.PrimitiveTypes.Int64},
		{Name: "text", Type: arrow.PrimitiveTypes.Int64},
	}, nil)
	b := array.NewRecordBuilder(mem, sc)
	defer b.Release()
	b.Field(0).(*array.Int64Builder).Append(1)
	b.Field(1).(*array.Int64Builder).Append(2)
	rec := b.NewRecordBatch()
	defer rec.Release()
	f, err := os.Create(p)
	must(t, err)
	defer f.Close()
	w, err := pqarrow.NewFileWriter(sc, f, parquet.NewWriterProperties(), pqarrow.NewArrowWriterProperties(pqarrow.WithAllocator(mem)))
	must(t, err)
	must(t, w.Write(rec))
	must(t, w.Close())
}

// FuzzParquetSource feeds arbitrary bytes as a Parquet file: the source
// never panics, never emits a bad sample, and keeps its counters straight.
func FuzzParquetSource(f *testing.F) {
	p := filepath.Join(f.TempDir(), "seed.parquet")
	writeParquet(f, p, []pqRow{
		{id: "a", img: ptr("img"), text: ptr("one")},
		{id: "", img: nil, text: ptr("two")},
		{id: "c", img: ptr("img"), text: nil},
	}, true, 2)
	seed, err := os.ReadFile(p)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{})
	f.Add(seed[:len(seed)/2])
	f.Add(append([]byte("PAR1"), seed[len(seed)-64:]...))
	p = filepath.Join(f.TempDir(), "f.parquet") // one file per worker process, rewritten per input
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		src := newParquetSource([]string{p}, Options{MaxImageBytes: 1 << 16, MaxCaptionBytes: 1 << 12, MaxRowGroupBytes: 1 << 20}.withDefaults())
		defer src.Close()
		n := 0
		for {
			s, err := src.Next(context.Background())
			if errors.Is(err, io.EOF) || errors.Is(err, ErrSchema) {
				break
			}
			if err != nil {
				t.Fatalf("Next: %v", err)
			}
			if len(s.Image) == 0 || CheckCaption(s.Text) != "" || len(s.Text) > 1<<12 {
				t.Errorf("emitted a bad sample %+v", s)
			}
			n++
		}
		st := src.Stats()
		if st.Seen != st.Emitted+st.Quarantined || st.Emitted != int64(n) {
			t.Errorf("stats %+v, emitted %d", st, n)
		}
	})
}
