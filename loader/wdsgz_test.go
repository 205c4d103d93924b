package loader

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// gzBytes gzips b.
func gzBytes(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, err := zw.Write(b)
	must(t, err)
	must(t, zw.Close())
	return buf.Bytes()
}

// TestTarGzSameAsTar reads the members of TestTarSource as .tar.gz and .tgz:
// the same samples and the same rejects (by reason) as the plain tar.
func TestTarGzSameAsTar(t *testing.T) {
	ms := []member{
		{"sub/", ""},
		{"sub/000001.jpg", "img1"}, {"sub/000001.txt", "caption one"},
		{"000002.json", `{"caption":"from json","id":"custom-2"}`}, {"000002.png", "img2"},
		{"000004.jpg", "img4"},
		{"000005.txt", "no image"},
		{"000006.jpg", "toolarge-image-bytes"}, {"000006.txt", "t"},
		{"000009.jpg", "img9"}, {"000009.json", `{"caption":`},
		{"a.b.c.jpg", "img10"}, {"a.b.c.txt", "key up to first dot"},
	}
	dir := t.TempDir()
	plain := tarBytes(t, ms)
	writeFile(t, filepath.Join(dir, "s.tar"), plain)
	want := drain(t, filepath.Join(dir, "s.tar"), Options{MaxImageBytes: 10})
	for _, name := range []string{"s.tar.gz", "S.TGZ"} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, name)
			writeFile(t, p, gzBytes(t, plain))
			got := drain(t, p, Options{MaxImageBytes: 10})
			if g, w := summary(got), summary(want); g != w {
				t.Errorf("got %s\nwant %s", g, w)
			}
		})
	}
}

// summary renders samples and reject reasons, without shard names.
func summary(d drained) string {
	var b strings.Builder
	for _, s := range d.samples {
		b.WriteString(s.ID + "=" + s.Text + "/" + string(s.Image) + "/" + s.ImageName + " ")
	}
	for _, r := range d.rejects {
		b.WriteString(r.Reason + " ")
	}
	return b.String()
}

// TestTarGzIndexReadsBack scans .tar.gz shards (a brace pattern, several
// gzip members in one file), re-reads every image in reverse order (a
// shuffled plan's access), and Close removes the inflated copies.
func TestTarGzIndexReadsBack(t *testing.T) {
	dir := t.TempDir()
	for s := range 2 {
		var ms []member
		for k := range 5 {
			key := string(rune('a'+s)) + string(rune('0'+k))
			ms = append(ms, member{key + ".jpg", strings.Repeat(key, 300+k)}, member{key + ".txt", "caption " + key})
		}
		data := tarBytes(t, ms)
		// two gzip members (a concatenated stream, as pigz or cat write)
		gz := append(gzBytes(t, data[:1024]), gzBytes(t, data[1024:])...)
		writeFile(t, filepath.Join(dir, "shard-"+string(rune('0'+s))+".tgz"), gz)
	}
	spool := t.TempDir()
	ix, err := BuildIndex(context.Background(), filepath.Join(dir, "shard-{0..1}.tgz"), Options{SpoolDir: spool})
	if err != nil {
		t.Fatal(err)
	}
	if ix.Len() != 10 {
		t.Fatalf("indexed %d entries, want 10 (stats %+v)", ix.Len(), ix.Stats)
	}
	for i := ix.Len() - 1; i >= 0; i-- {
		e := ix.Entry(i)
		img, err := ix.ReadImage(e)
		if err != nil {
			t.Fatalf("ReadImage(%s): %v", e.ID, err)
		}
		if want := strings.Repeat(e.ID, 300+int(e.ID[1]-'0')); string(img) != want {
			t.Errorf("%s: got %d bytes %.8q, want %d bytes", e.ID, len(img), img, len(want))
		}
		head, err := ix.ReadHeader(e, 4)
		if err != nil || string(head) != e.ID+e.ID {
			t.Errorf("%s: header %q, %v; want %q", e.ID, head, err, e.ID+e.ID)
		}
	}
	if n := countFiles(t, spool); n != 2 {
		t.Errorf("%d inflated copies under the spool folder, want one per shard (2)", n)
	}
	must(t, ix.Close())
	if n := countFiles(t, spool); n != 0 {
		t.Errorf("%d files left under the spool folder after Close, want 0", n)
	}
	if _, err := ix.ReadImage(ix.Entry(3)); err != nil {
		t.Errorf("ReadImage after Close: %v, want the index to stay readable", err)
	}
	must(t, ix.Close())
}

func countFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	must(t, filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return err
	}))
	return n
}

// TestTarGzHostile: truncated and corrupt streams quarantine what they break
// (broken_tar, with the gzip error as detail) and keep the samples before.
func TestTarGzHostile(t *testing.T) {
	full := tarBytes(t, []member{
		{"000001.jpg", "img1"}, {"000001.txt", "one"},
		{"000002.jpg", string(bytes.Repeat([]byte("0123456789abcdef"), 4000))}, {"000002.txt", "two"},
		{"000003.jpg", "img3"}, {"000003.txt", "three"},
	})
	gz := gzBytes(t, full)
	flipped := append([]byte{}, gz...)
	flipped[len(flipped)/2] ^= 0xff
	badCRC := append([]byte{}, gz...)
	badCRC[len(badCRC)-8] ^= 0xff // the CRC-32 of the trailer
	tests := []struct {
		name       string
		data       []byte
		wantIDs    string
		wantDetail string // in a broken_tar reject
	}{
		{"truncated stream", gz[:len(gz)/2], "000001", "unexpected EOF"},
		{"truncated before the trailer", gz[:len(gz)-4], "000001,000002,000003", "unexpected EOF"},
		{"corrupt deflate data", flipped, "000001", "invalid tar header"},
		{"bad checksum in the trailer", badCRC, "000001,000002,000003", "checksum"},
		{"not gzip", []byte("plain text, not a gzip stream"), "", "gzip: invalid header"},
		{"gzip of garbage", gzBytes(t, bytes.Repeat([]byte("x"), 2048)), "", "offset"},
		{"empty file", nil, "", "EOF"},
	}
	dir := t.TempDir()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, "bad"+string(rune('a'+i))+".tar.gz")
			writeFile(t, p, tt.data)
			for _, scan := range []bool{false, true} {
				d := drainOrScan(t, p, scan)
				if got := strings.Join(ids(d.samples), ","); got != tt.wantIDs {
					t.Errorf("scan=%v: emitted %q, want %q", scan, got, tt.wantIDs)
				}
				if !hasReject(d.rejects, ReasonBrokenTar, tt.wantDetail) {
					t.Errorf("scan=%v: no broken_tar reject with %q in %+v", scan, tt.wantDetail, d.rejects)
				}
			}
		})
	}
}

// drainOrScan reads p with Next (scan false) or as Scan does, without image
// bytes (scan true).
func drainOrScan(t *testing.T, p string, scan bool) drained {
	t.Helper()
	if !scan {
		return drain(t, p, Options{})
	}
	var d drained
	ix, err := BuildIndex(context.Background(), p, Options{OnReject: func(r Reject) { d.rejects = append(d.rejects, r) }})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	for _, e := range ix.All() {
		d.samples = append(d.samples, Sample{ID: e.ID})
	}
	return d
}

func hasReject(rs []Reject, reason, detail string) bool {
	for _, r := range rs {
		if r.Reason == reason && strings.Contains(r.Detail, detail) {
			return true
		}
	}
	return false
}

// TestTarGzBomb: a few KiB of gzip that inflate to a 32 MiB image member and
// a 32 MiB member of another kind. The image is too_large without being
// inflated into memory, the other member is skipped, the next sample is read,
// and a cancelled context stops the skipping.
func TestTarGzBomb(t *testing.T) {
	const big = 32 << 20
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	must(t, err)
	tw := newStreamTar(zw)
	tw.add(t, "1.jpg", []byte("img1"))
	tw.add(t, "1.txt", []byte("one"))
	tw.addZeros(t, "2.jpg", big)
	tw.add(t, "2.txt", []byte("two"))
	tw.addZeros(t, "3.bin", big)
	tw.add(t, "3.jpg", []byte("img3"))
	tw.add(t, "3.txt", []byte("three"))
	must(t, tw.tw.Close())
	must(t, zw.Close())
	if buf.Len() > 1<<20 {
		t.Fatalf("bomb is %d bytes compressed, want < 1 MiB", buf.Len())
	}
	p := filepath.Join(t.TempDir(), "bomb.tar.gz")
	writeFile(t, p, buf.Bytes())

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	d := drain(t, p, Options{MaxImageBytes: 1 << 20})
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
		t.Errorf("reading the bomb allocated %d MiB, want < 8 MiB (members are skipped, not held)", alloc>>20)
	}
	if got := strings.Join(ids(d.samples), ","); got != "1,3" {
		t.Errorf("emitted %q, want 1,3", got)
	}
	if !hasReject(d.rejects, ReasonTooLarge, "") {
		t.Errorf("no too_large reject: %+v", d.rejects)
	}

	src, err := Open(p, Options{MaxImageBytes: 1 << 20})
	must(t, err)
	defer src.Close()
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := src.Next(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := src.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Next after cancel: got %v, want context.Canceled", err)
	}
}

// streamTar writes tar members to a stream, with zero-filled members written
// in chunks (never held in memory).
type streamTar struct{ tw *tarWriter }

func newStreamTar(w io.Writer) *streamTar { return &streamTar{tw: newTarWriter(w)} }

func (s *streamTar) add(t *testing.T, name string, data []byte) {
	must(t, s.tw.header(name, int64(len(data))))
	_, err := s.tw.Write(data)
	must(t, err)
}

func (s *streamTar) addZeros(t *testing.T, name string, n int64) {
	must(t, s.tw.header(name, n))
	zero := make([]byte, 1<<20)
	for left := n; left > 0; left -= int64(len(zero)) {
		_, err := s.tw.Write(zero[:min(left, int64(len(zero)))])
		must(t, err)
	}
}

// FuzzTarGzSource feeds arbitrary bytes as a .tar.gz shard.
func FuzzTarGzSource(f *testing.F) {
	good := tarBytes(f, []member{{"1.jpg", "i"}, {"1.txt", "t"}, {"2.json", `{"caption":"c"}`}, {"2.png", "p"}})
	f.Add(gzBytes(f, good))
	f.Add(gzBytes(f, good)[:100])
	f.Add(gzBytes(f, []byte("not a tar")))
	f.Add([]byte("not gzip"))
	f.Fuzz(func(t *testing.T, data []byte) {
		src := newTarSource([]string{"f.tar.gz"}, Options{MaxImageBytes: 1 << 16, MaxCaptionBytes: 1 << 16}.withDefaults())
		src.open = func(string, string) (io.ReadSeekCloser, error) { return nopCloser{bytes.NewReader(data)}, nil }
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
		st := src.Stats()
		if st.Seen != st.Emitted+st.Quarantined || st.Emitted != int64(n) {
			t.Errorf("stats %+v, emitted %d", st, n)
		}
	})
}

// tarWriter is archive/tar's writer with a one-call header for regular files.
type tarWriter struct{ *tar.Writer }

func newTarWriter(w io.Writer) *tarWriter { return &tarWriter{tar.NewWriter(w)} }

func (w *tarWriter) header(name string, size int64) error {
	return w.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, Typeflag: tar.TypeReg})
}
