package loader

import (
	"context"
	"errors"
	"io"
	"os"
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
		for _, e := range ix.All() {
			if img, err := ix.ReadImage(e); err == nil && string(img) == "SECRET" {
				t.Fatalf("read %s from outside the folder", e.Location)
			}
		}
	})
}

// FuzzArrowSource feeds arbitrary bytes as an Arrow IPC file: the source
// never panics, ends with io.EOF or ErrSchema, emits only samples that pass
// the checks, and the index re-reads every entry it kept (or fails with an
// error, never a panic).
func FuzzArrowSource(f *testing.F) {
	dir := f.TempDir()
	seed := filepath.Join(dir, "seed.arrow")
	writeArrowStream(f, seed, [][]hfRow{hfRows("a", 2), {{path: "x.jpg", caption: "path only"}, {img: []byte("b"), caption: " "}}}, false)
	stream, err := os.ReadFile(seed)
	if err != nil {
		f.Fatal(err)
	}
	writeArrowStream(f, seed, [][]hfRow{hfRows("f", 3)}, true)
	file, err := os.ReadFile(seed)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range [][]byte{stream, file, stream[:len(stream)/2], file[:len(file)-10], {}} {
		f.Add(s)
	}
	p := filepath.Join(f.TempDir(), "f.arrow") // one file per worker process, rewritten per input
	// kept columns of hostile batches too
	keep, err := ParseKeep("image,json:image.path,caption")
	if err != nil {
		f.Fatal(err)
	}
	opts := Options{TextColumn: "caption", MaxImageBytes: 1 << 16, MaxCaptionBytes: 1 << 12, MaxRowGroupBytes: 1 << 20, Keep: keep}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		src := newArrowSource([]string{p}, opts.withDefaults())
		defer src.Close()
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
		}
		ix, err := BuildIndex(context.Background(), p, opts)
		if err != nil {
			return
		}
		defer ix.Close()
		for _, e := range ix.All() {
			_, _ = ix.ReadImage(e)
		}
	})
}
