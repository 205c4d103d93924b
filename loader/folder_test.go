package loader

import (
	"context"
	"path/filepath"
	"reflect"
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

// TestFolderMetadata: an image folder in the HF imagefolder layout takes
// each image's caption from its metadata.jsonl or metadata.csv row (a
// subfolder's file_name relative to its metadata file's folder), and --keep
// reads the row's other columns (a JSON label, a url); an image without a
// row keeps its sidecar; bad rows are quarantined with a reason. Before, the
// metadata files were ignored: captions came from .txt sidecars only and
// --keep kept only "caption".
func TestFolderMetadata(t *testing.T) {
	for _, tc := range []struct {
		name, file, body, sub string
	}{
		{"jsonl", FolderMetadataJSONL, `{"file_name": "a.jpg", "text": "a cat", "label": 3, "url": "http://e/a"}
{"file_name": "cats/b.png", "text": "b cat", "label": 5}
not json
{"file_name": "../up.jpg", "text": "x"}
{"file_name": "gone.jpg", "text": "x"}
{"file_name": "a.jpg", "text": "again"}
{"file_name": "c.jpg", "label": 1}
`, `{"file_name": "d.jpg", "text": "d dog", "label": 9}` + "\n"},
		{"csv", FolderMetadataCSV, `file_name,text,label,url
a.jpg,a cat,3,http://e/a
cats/b.png,"b cat",5,
"bad"quote,x,1,
../up.jpg,x,1,
gone.jpg,x,1,
a.jpg,again,1,
`, "file_name,text,label\nd.jpg,d dog,9\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, data := range map[string]string{
				"a.jpg": "img-a", "a.txt": "a sidecar the row overrides", "cats/b.png": "img-b", "c.jpg": "img-c",
				"e.jpg": "img-e", "e.txt": "e from its sidecar", tc.file: tc.body, "dogs/" + tc.file: tc.sub, "dogs/d.jpg": "img-d",
			} {
				writeFile(t, filepath.Join(dir, name), []byte(data))
			}
			keep, err := ParseKeep("json:label,url,caption")
			must(t, err)
			opts := DefaultOptions()
			opts.Keep = keep
			var rejects []Reject
			opts.OnReject = func(r Reject) { rejects = append(rejects, r) }
			ix, err := BuildIndex(context.Background(), dir, opts)
			must(t, err)
			defer ix.Close()
			got := map[string]string{}
			kept := map[string][]KeepValue{}
			for _, e := range ix.All() {
				got[e.ID] = e.Text
				kept[e.ID] = ix.Kept(e)
			}
			want := map[string]string{"a.jpg": "a cat", "cats/b.png": "b cat", "dogs/d.jpg": "d dog", "e.jpg": "e from its sidecar"}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("captions %v, want %v", got, want)
			}
			v := func(s string) KeepValue { return KeepValue{Text: s, Valid: true} }
			label := func(s string) KeepValue { // a JSON number, a CSV string
				if tc.name == "csv" {
					return v(s)
				}
				return KeepValue{Text: s, Num: true, Valid: true}
			}
			url := KeepValue{}
			if tc.name == "csv" {
				url = v("") // an empty CSV cell is an empty string
			}
			for id, w := range map[string][]KeepValue{
				"a.jpg":      {label("3"), v("http://e/a"), v("a cat")},
				"cats/b.png": {label("5"), url, v("b cat")},
				"dogs/d.jpg": {label("9"), {}, v("d dog")},
				"e.jpg":      {{}, {}, v("e from its sidecar")},
			} {
				if !reflect.DeepEqual(kept[id], w) {
					t.Errorf("%s: kept %+v, want %+v", id, kept[id], w)
				}
			}
			reasons := map[string]int{}
			for _, r := range rejects {
				reasons[r.Reason]++
			}
			// c.jpg: a row without text (jsonl), no row and no sidecar (csv)
			wantReasons := map[string]int{ReasonBadManifestLine: 1, ReasonEscapesRoot: 1, ReasonMissingImage: 1, ReasonDuplicateID: 1, ReasonMissingCaption: 1}
			if !reflect.DeepEqual(reasons, wantReasons) {
				t.Errorf("rejects %v (%+v), want %v", reasons, rejects, wantReasons)
			}
		})
	}
}
