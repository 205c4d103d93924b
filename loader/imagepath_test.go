package loader

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestParquetImagePaths reads an HF Image column that holds only paths (what
// Dataset.to_parquet writes for images built from local files), under the
// manifest's no-escape rules.
func TestParquetImagePaths(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(dir, "imgs", "a.jpg"), []byte("AAAA"))
	writeFile(t, filepath.Join(dir, "imgs", "b.jpg"), []byte("BBBBB"))
	writeFile(t, filepath.Join(outside, "x.jpg"), []byte("XX"))
	must(t, os.Symlink(filepath.Join(outside, "x.jpg"), filepath.Join(dir, "imgs", "out.jpg")))
	must(t, os.Symlink("a.jpg", filepath.Join(dir, "imgs", "in.jpg")))
	must(t, os.Mkdir(filepath.Join(dir, "imgs", "sub"), 0o755))
	rows := []pqRow{
		{id: "rel", text: ptr("relative"), path: "imgs/a.jpg"},
		{id: "abs", text: ptr("absolute inside"), path: filepath.Join(dir, "imgs", "b.jpg")},
		{id: "inlink", text: ptr("link inside"), path: "imgs/in.jpg"},
		{id: "absout", text: ptr("absolute outside"), path: filepath.Join(outside, "x.jpg")},
		{id: "dotdot", text: ptr("dot dot"), path: "../x.jpg"},
		{id: "outlink", text: ptr("link outside"), path: "imgs/out.jpg"},
		{id: "gone", text: ptr("missing"), path: "imgs/gone.jpg"},
		{id: "dir", text: ptr("a directory"), path: "imgs/sub"},
		{id: "nopath", text: ptr("neither bytes nor path")},
		{id: "bytes", img: ptr("inline"), text: ptr("bytes win"), path: "imgs/gone.jpg"},
	}
	p := filepath.Join(dir, "train.parquet")
	writeParquet(t, p, rows, true, 4)
	cases := []struct {
		name   string
		opts   Options
		images map[string]string // id → image bytes of the samples
		reject map[string]string // id → reason
	}{
		{"default root: the Parquet folder", Options{},
			map[string]string{"rel": "AAAA", "abs": "BBBBB", "inlink": "AAAA", "bytes": "inline"},
			map[string]string{"absout": ReasonEscapesRoot, "dotdot": ReasonEscapesRoot, "outlink": ReasonEscapesRoot,
				"gone": ReasonMissingImage, "dir": ReasonNotRegular, "nopath": ReasonMissingImage}},
		{"allow absolute", Options{AllowAbsolute: true},
			map[string]string{"rel": "AAAA", "abs": "BBBBB", "inlink": "AAAA", "absout": "XX", "bytes": "inline"},
			map[string]string{"dotdot": ReasonEscapesRoot, "outlink": ReasonEscapesRoot,
				"gone": ReasonMissingImage, "dir": ReasonNotRegular, "nopath": ReasonMissingImage}},
		{"root /", Options{Root: "/"},
			map[string]string{"abs": "BBBBB", "absout": "XX", "bytes": "inline"},
			map[string]string{"rel": ReasonMissingImage, "inlink": ReasonMissingImage, "dotdot": ReasonEscapesRoot,
				"outlink": ReasonMissingImage, "gone": ReasonMissingImage, "dir": ReasonMissingImage, "nopath": ReasonMissingImage}},
		{"root elsewhere", Options{Root: filepath.Join(dir, "imgs")},
			map[string]string{"abs": "BBBBB", "bytes": "inline"},
			map[string]string{"rel": ReasonMissingImage, "inlink": ReasonMissingImage, "absout": ReasonEscapesRoot,
				"dotdot": ReasonEscapesRoot, "outlink": ReasonMissingImage, "gone": ReasonMissingImage,
				"dir": ReasonMissingImage, "nopath": ReasonMissingImage}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := drain(t, p, c.opts)
			got := map[string]string{}
			for _, s := range d.samples {
				got[s.ID] = string(s.Image)
			}
			if len(got) != len(c.images) {
				t.Errorf("samples %v, want %v", got, c.images)
			}
			for id, img := range c.images {
				if got[id] != img {
					t.Errorf("sample %s: image %q, want %q", id, got[id], img)
				}
			}
			rej := map[string]string{}
			for _, r := range d.rejects {
				rej[r.ID] = r.Reason
			}
			if len(rej) != len(c.reject) {
				t.Errorf("rejects %v, want %v", rej, c.reject)
			}
			for id, reason := range c.reject {
				if rej[id] != reason {
					t.Errorf("reject %s: %q, want %q", id, rej[id], reason)
				}
			}
		})
	}
}

// TestParquetImagePathIndex re-reads a path image through the index, and
// refuses it once the file is swapped for a link that leaves the root.
func TestParquetImagePathIndex(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(dir, "imgs", "a.jpg"), []byte("AAAA"))
	writeFile(t, filepath.Join(outside, "a.jpg"), []byte("SECR"))
	p := filepath.Join(dir, "train.parquet")
	writeParquet(t, p, []pqRow{{id: "a", text: ptr("cat"), path: filepath.Join(dir, "imgs", "a.jpg")}}, true, 4)
	ix, err := BuildIndex(context.Background(), p, Options{})
	must(t, err)
	defer ix.Close()
	if ix.Len() != 1 || ix.Entry(0).ImageSize != 4 || ix.Entry(0).ImageName != "a.jpg" {
		t.Fatalf("entries %+v", ix.All())
	}
	img, err := ix.ReadImage(ix.Entry(0))
	if err != nil || string(img) != "AAAA" {
		t.Fatalf("ReadImage: %q, %v", img, err)
	}
	must(t, os.Remove(filepath.Join(dir, "imgs", "a.jpg")))
	must(t, os.Symlink(filepath.Join(outside, "a.jpg"), filepath.Join(dir, "imgs", "a.jpg")))
	if img, err := ix.ReadImage(ix.Entry(0)); !errors.Is(err, ErrEscapesRoot) {
		t.Fatalf("ReadImage after the swap: %q, %v; want ErrEscapesRoot", img, err)
	}
}
