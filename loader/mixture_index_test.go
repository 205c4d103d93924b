package loader

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"
)

// manifestOf writes a manifest of the given ids (image bytes "img-<id>")
// under dir and returns its path.
func manifestOf(t *testing.T, dir string, ids ...string) string {
	t.Helper()
	var b bytes.Buffer
	for _, id := range ids {
		writeFile(t, filepath.Join(dir, id+".jpg"), []byte("img-"+dir+"-"+id))
		fmt.Fprintf(&b, `{"id": %q, "image": %q, "text": "caption %s"}`+"\n", id, id+".jpg", id)
	}
	p := filepath.Join(dir, "manifest.jsonl")
	writeFile(t, p, b.Bytes())
	return p
}

// TestCombineIndexes: ids are prefixed per source (two sources may share
// ids), each entry's image is read by its own source, and an id that reads
// as a repetition of another entry of its source is quarantined.
func TestCombineIndexes(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	a, err := BuildIndex(context.Background(), manifestOf(t, dirA, "x", "y"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := BuildIndex(context.Background(), manifestOf(t, dirB, "x", "x#1", "z#1"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var rejects []Reject
	m, err := CombineIndexes([]string{"a", "b"}, []*Index{a, b}, func(r Reject) { rejects = append(rejects, r) })
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var got []string
	for _, e := range m.All() {
		got = append(got, e.ID)
	}
	if want := "[a/x a/y b/x b/z#1]"; fmt.Sprint(got) != want {
		t.Fatalf("ids %v, want %s", got, want)
	}
	if len(rejects) != 1 || rejects[0].ID != "b/x#1" || rejects[0].Reason != ReasonDuplicateID {
		t.Fatalf("rejects %+v, want b/x#1 as duplicate_id", rejects)
	}
	if m.Stats.Seen != 5 || m.Stats.Emitted != 4 || m.Stats.Quarantined != 1 {
		t.Fatalf("stats %+v, want seen 5 = emitted 4 + quarantined 1", m.Stats)
	}
	if m.Size(0) != 2 || m.Size(1) != 2 || m.SourceOf(1) != 0 || m.SourceOf(2) != 1 || m.SourceOf(3) != 1 {
		t.Fatalf("offsets %v", m.Offsets)
	}
	for i, want := range []string{dirA + "-x", dirA + "-y", dirB + "-x", dirB + "-z#1"} {
		img, err := m.ReadImage(m.Entry(i))
		if err != nil || string(img) != "img-"+want {
			t.Fatalf("entry %s: image %q, %v, want img-%s", m.Entry(i).ID, img, err, want)
		}
	}
}
