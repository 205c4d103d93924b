package loader

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// swapCase is a dataset whose file victim is swapped after indexing; reread
// reads its one image (want: the bytes read).
type swapCase struct {
	name   string
	build  func(t *testing.T, data string) (input, victim string)
	reread func(ix *Index) ([]byte, error)
	want   string
}

func swapCases() []swapCase {
	image := func(ix *Index) ([]byte, error) { return ix.ReadImage(ix.Entry(0)) }
	header := func(ix *Index) ([]byte, error) { return ix.ReadHeader(ix.Entry(0), 4) }
	manifest := func(t *testing.T, data string) (string, string) {
		writeFile(t, filepath.Join(data, "img", "a.jpg"), []byte("indexed image"))
		writeFile(t, filepath.Join(data, "m.jsonl"), []byte(`{"image":"img/a.jpg","text":"a caption"}`+"\n"))
		return filepath.Join(data, "m.jsonl"), filepath.Join(data, "img", "a.jpg")
	}
	folder := func(t *testing.T, data string) (string, string) {
		writeFile(t, filepath.Join(data, "img", "a.jpg"), []byte("indexed image"))
		writeFile(t, filepath.Join(data, "img", "a.txt"), []byte("a caption"))
		return data, filepath.Join(data, "img", "a.jpg")
	}
	shard := func(t *testing.T, data string) (string, string) {
		p := filepath.Join(data, "s.tar")
		writeFile(t, p, tarBytes(t, []member{{"a.jpg", "indexed image"}, {"a.txt", "a caption"}}))
		return p, p
	}
	tgz := func(t *testing.T, data string) (string, string) {
		p := filepath.Join(data, "s.tar.gz")
		writeFile(t, p, gzBytes(t, tarBytes(t, []member{{"a.jpg", "indexed image"}, {"a.txt", "a caption"}})))
		return p, p
	}
	pq := func(t *testing.T, data string) (string, string) {
		p := filepath.Join(data, "p.parquet")
		must(t, os.MkdirAll(data, 0o755))
		writeParquet(t, p, []pqRow{{id: "a", img: ptr("indexed image"), text: ptr("a caption")}}, false, 10)
		return p, p
	}
	pqPath := func(t *testing.T, data string) (string, string) { // an HF Image struct that holds only the path
		writeFile(t, filepath.Join(data, "img", "a.jpg"), []byte("indexed image"))
		p := filepath.Join(data, "p.parquet")
		writeParquet(t, p, []pqRow{{id: "a", text: ptr("a caption"), path: "img/a.jpg"}}, true, 10)
		return p, filepath.Join(data, "img", "a.jpg")
	}
	arrowFile := func(t *testing.T, data string) (string, string) {
		p := filepath.Join(data, "a.arrow")
		must(t, os.MkdirAll(data, 0o755))
		writeArrowText(t, p, "indexed image", "a caption")
		return p, p
	}
	const all, head = "indexed image", "inde"
	return []swapCase{
		{"manifest/image", manifest, image, all}, {"manifest/header", manifest, header, head},
		{"folder/image", folder, image, all}, {"folder/header", folder, header, head},
		{"tar/image", shard, image, all}, {"tar/header", shard, header, head},
		{"tgz/image", tgz, image, all}, {"parquet/image", pq, image, all},
		{"parquet-path/image", pqPath, image, all}, {"parquet-path/header", pqPath, header, head},
		{"arrow/image", arrowFile, image, all},
	}
}

// swapFor replaces victim by a symbolic link to target (relative to the
// victim's folder, or absolute), after copying the victim's bytes to the
// target so that the size the index holds still matches.
func swapFor(t *testing.T, victim, target string) {
	t.Helper()
	data, err := os.ReadFile(victim)
	must(t, err)
	full := target
	if !filepath.IsAbs(target) {
		full = filepath.Join(filepath.Dir(victim), target)
	}
	writeFile(t, full, data)
	must(t, os.Remove(victim))
	must(t, os.Symlink(target, victim))
}

// TestReadRefusesSwappedLink: a file swapped after indexing for a link to a
// same-size file outside the dataset root is refused by the open that reads
// it (ErrEscapesRoot), for every format and for header reads too, with
// openat2 and with the fallback walk; a link that stays inside is read.
func TestReadRefusesSwappedLink(t *testing.T) {
	for _, walk := range []bool{false, true} {
		for _, c := range swapCases() {
			for _, link := range []struct {
				name   string
				target func(root, victim string) string
				escape bool
			}{
				{"absolute-outside", func(root, _ string) string { return filepath.Join(root, "outside", "x") }, true},
				{"relative-outside", func(root, v string) string { return rel(t, filepath.Dir(v), filepath.Join(root, "outside", "x")) }, true},
				{"relative-inside", func(root, v string) string { return rel(t, filepath.Dir(v), filepath.Join(root, "data", "other", "x")) }, false},
			} {
				t.Run(c.name+"/"+link.name+"/walk="+boolName(walk), func(t *testing.T) {
					if walk {
						forceWalk(t)
					}
					root := t.TempDir()
					input, victim := c.build(t, filepath.Join(root, "data"))
					ix, err := BuildIndex(context.Background(), input, Options{})
					must(t, err)
					defer ix.Close()
					if ix.Len() != 1 {
						t.Fatalf("indexed %d entries, want 1", ix.Len())
					}
					swapFor(t, victim, link.target(root, victim))
					got, err := c.reread(ix)
					switch {
					case link.escape && !errors.Is(err, ErrEscapesRoot):
						t.Errorf("got %q, %v; want ErrEscapesRoot", got, err)
					case link.escape && readReason(err) != ReasonEscapesRoot:
						t.Errorf("reason %q, want %q", readReason(err), ReasonEscapesRoot)
					case !link.escape && (err != nil || string(got) != c.want):
						t.Errorf("got %q, %v; want %q", got, err, c.want)
					}
				})
			}
		}
	}
}

func rel(t *testing.T, from, to string) string {
	t.Helper()
	r, err := filepath.Rel(from, to)
	must(t, err)
	return r
}

func boolName(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// forceWalk makes openBeneath use walkBeneath for the rest of the test.
func forceWalk(t *testing.T) {
	was := noOpenat2.Swap(true)
	t.Cleanup(func() { noOpenat2.Store(was) })
}

// TestWalkBeneath calls the fallback walk directly, and openat2 (where the
// kernel has it) with the same inputs: both follow links that stay inside
// and refuse, with the same errno, whatever leaves the root.
func TestWalkBeneath(t *testing.T) {
	root := t.TempDir()
	in := filepath.Join(root, "in")
	writeFile(t, filepath.Join(in, "f"), []byte("file"))
	writeFile(t, filepath.Join(in, "sub", "g"), []byte("sub file"))
	writeFile(t, filepath.Join(root, "secret"), []byte("secret"))
	for link, target := range map[string]string{
		"rel": "f", "chain": "rel", "subrel": "sub/g", "up": "sub/../f", "dirlink": "sub",
		"sub/back": "../f", "abs": filepath.Join(in, "f"), "out": "../secret", "sub/out": "../../secret",
		"loop1": "loop2", "loop2": "loop1", "dangling": "nothing", "outdir": "..",
	} {
		symlink(t, target, filepath.Join(in, link))
	}
	cases := []struct {
		rel  string
		want string // file content, or "" with errno
		err  unix.Errno
	}{
		{"f", "file", 0}, {"sub/g", "sub file", 0}, {"./sub/./g", "sub file", 0}, {"sub/../f", "file", 0},
		{"rel", "file", 0}, {"chain", "file", 0}, {"subrel", "sub file", 0}, {"up", "file", 0},
		{"dirlink/g", "sub file", 0}, {"sub/back", "file", 0}, {"dirlink/back", "file", 0},
		{"abs", "", unix.EXDEV}, {"out", "", unix.EXDEV}, {"sub/out", "", unix.EXDEV},
		{"../secret", "", unix.EXDEV}, {"sub/../../secret", "", unix.EXDEV}, {"outdir/secret", "", unix.EXDEV},
		{"loop1", "", unix.ELOOP}, {"dangling", "", unix.ENOENT}, {"missing", "", unix.ENOENT},
		{"f/x", "", unix.ENOTDIR},
	}
	dir, err := unix.Open(in, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	defer unix.Close(dir)
	const flags = unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC
	for _, c := range cases {
		for _, way := range []struct {
			name string
			open func(int, string, int) (int, error)
		}{{"walk", walkBeneath}, {"openat2", openat2Beneath}} {
			fd, err := way.open(dir, c.rel, flags)
			if err == errNoOpenat2 {
				continue
			}
			if got := readFD(t, fd, err); got != c.want || (c.err != 0 && err != c.err) {
				t.Errorf("%s(%q): got %q, %v; want %q, errno %v", way.name, c.rel, got, err, c.want, c.err)
			}
		}
	}
}

// readFD reads and closes fd; "" when err is set.
func readFD(t *testing.T, fd int, err error) string {
	t.Helper()
	if err != nil {
		return ""
	}
	f := os.NewFile(uintptr(fd), "fd")
	defer f.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(f)
	must(t, err)
	return b.String()
}
