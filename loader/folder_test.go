package loader

import (
	"path/filepath"
	"testing"
)

func TestFolderSource(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"cats/a.jpg": "img-a", "cats/a.txt": "a cat",
		"cats/b.PNG": "img-b", "cats/b.txt": "b cat",
		"dogs/c.jpeg": "img-c", // no caption
		"dogs/d.webp": "", "dogs/d.txt": "zero bytes",
		"dogs/e.jpg": "img-e", "dogs/e.txt": "\x00bin",
		"orphan.txt": "no image",
		"notes.md":   "ignored",
	}
	for name, data := range files {
		writeFile(t, filepath.Join(dir, name), []byte(data))
	}
	d := drain(t, dir, Options{})
	if got := ids(d.samples); len(got) != 2 || got[0] != "cats/a.jpg" || got[1] != "cats/b.PNG" {
		t.Fatalf("got ids %v, want [cats/a.jpg cats/b.PNG]", got)
	}
	if s := d.samples[0]; s.Text != "a cat" || string(s.Image) != "img-a" || s.ImageName != "a.jpg" {
		t.Errorf("sample 0: got %+v", s)
	}
	want := map[string]string{
		"dogs/c.jpeg": ReasonMissingCaption, "dogs/d.webp": ReasonEmptyImage,
		"dogs/e.jpg": ReasonBinaryCaption, "orphan": ReasonMissingImage,
	}
	got := map[string]string{}
	for _, r := range d.rejects {
		got[r.ID] = r.Reason
	}
	for _, id := range sortedKeys(want) {
		if got[id] != want[id] {
			t.Errorf("%s: got reason %q, want %q", id, got[id], want[id])
		}
	}
	if len(got) != len(want) {
		t.Errorf("got rejects %v, want %v", got, want)
	}
}
