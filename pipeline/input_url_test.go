package pipeline

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// uploadDir copies every file below dir to the store at url, keyed by its relative path.
func uploadDir(t *testing.T, url, dir string) {
	t.Helper()
	ctx := context.Background()
	st, err := OpenStore(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return st.WriteFile(ctx, filepath.ToSlash(rel), func(w io.Writer) error { _, err := w.Write(b); return err })
	})
	if err != nil {
		t.Fatal(err)
	}
}

func datasetIDs(t *testing.T, cfg Config) []string {
	t.Helper()
	d, err := OpenDataset(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("OpenDataset(%s): %v", cfg.Input, err)
	}
	defer func() { mustOK(t, d.Close()) }()
	if IsURL(d.Config.Input) {
		t.Errorf("dataset config input %q is still a URL", d.Config.Input)
	}
	ids := make([]string, d.Index.Len())
	for i, e := range d.Index.All() {
		ids[i] = e.ID
	}
	return ids
}

// TestOpenDatasetFromURL: every command opens its dataset with OpenDataset (serve's
// planner and workers, report, shard), so an input URL works for all of them: a
// manifest on S3 (staged under Config.InputCache), WebDataset shards on S3 (streamed)
// and a file:// URL index the same entries as the local path. Before, OpenDataset took
// the URL for a path and failed with "stat s3://…".
func TestOpenDatasetFromURL(t *testing.T) {
	endpoint := fakeS3(t, "data")
	q := fmt.Sprintf("?endpoint=%s&region=us-east-1&use_path_style=true&disable_https=true", endpoint)
	manifest, wds := corpus(t, 40, "jsonl"), corpus(t, 40, "wds")
	uploadDir(t, "s3://data/m"+q, filepath.Dir(manifest))
	uploadDir(t, "s3://data/w"+q, wds)
	for _, tc := range []struct{ name, local, url string }{
		{"s3 manifest", manifest, "s3://data/m/" + filepath.Base(manifest) + q},
		{"s3 shards", wds, "s3://data/w" + q},
		{"file manifest", manifest, "file://" + manifest},
		{"file shards", wds, "file://" + wds},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := datasetIDs(t, testConfig(tc.local))
			cfg := testConfig(tc.url)
			cfg.InputCache = t.TempDir()
			got := datasetIDs(t, cfg)
			if len(want) == 0 || !slices.Equal(got, want) {
				t.Errorf("%s: %d entries, want the local path's %d (same ids in order: %v)", tc.url, len(got), len(want), slices.Equal(got, want))
			}
		})
	}
}
