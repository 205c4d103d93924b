package loader

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// FuzzHFDiskMeta feeds state.json and dataset_info.json contents to their
// parsers and to a save_to_disk folder holding one real data file: parsing
// never panics, every data file named stays a local .arrow path, the folder
// opens or fails with an error, and nothing outside it is read.
func FuzzHFDiskMeta(f *testing.F) {
	f.Add([]byte(`{"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": null}`),
		[]byte(`{"features": {"image": {"_type": "Image"}, "caption": {"dtype": "string", "_type": "Value"}}}`))
	f.Add([]byte(`{"_data_files": [{"filename": "../secret.arrow"}, {"filename": "/etc/passwd.arrow"}]}`), []byte(`{"features": []}`))
	f.Add([]byte(`{"_data_files": [{"filename": "data-00000-of-00001.arrow"}, {"filename": "data-00000-of-00001.arrow"}]}`),
		[]byte(`{"features": {"a": {"_type": "Image"}, "b": [{"_type": "Value"}], "c": {"feature": {}}}}`))
	f.Add([]byte(`{"_data_files": null}`), []byte(`null`))
	f.Fuzz(func(t *testing.T, state, info []byte) {
		if names, err := parseHFState(state); err == nil {
			for _, n := range names {
				if !filepath.IsLocal(n) || !strings.HasSuffix(n, ".arrow") {
					t.Fatalf("parseHFState gave %q", n)
				}
			}
		}
		if images, texts, err := parseHFInfo(info); err == nil && (!slices.IsSorted(images) || !slices.IsSorted(texts)) {
			t.Fatalf("parseHFInfo: unsorted %v %v", images, texts)
		}
		root := t.TempDir()
		dir := filepath.Join(root, "ds")
		writeHFDisk(t, dir, [][][]hfRow{{hfRows("a", 2)}})
		writeArrowStream(t, filepath.Join(root, "secret.arrow"), [][]hfRow{{{img: []byte("SECRET"), caption: "secret"}}}, false)
		writeFile(t, filepath.Join(dir, HFStateFile), state)
		writeFile(t, filepath.Join(dir, HFInfoFile), info)
		ix, err := BuildIndex(context.Background(), dir, Options{TextColumn: "caption"})
		if err != nil {
			return
		}
		defer ix.Close()
		for _, e := range ix.Entries {
			if img, err := ix.ReadImage(e); err == nil && string(img) == "SECRET" {
				t.Fatalf("read %s from outside the folder", e.Location)
			}
		}
	})
}
