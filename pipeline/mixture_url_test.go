package pipeline

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
)

// TestMixtureSourceURLs: a mixture source's path takes the URLs --input
// takes: a file:// manifest, WebDataset shards over http:// (streamed with
// ranged GETs) and a manifest on S3 (staged) give the same draws, items
// (image headers read through each source's own Remote) and plan as the
// local paths. Before, a URL source was indexed as a local path and failed
// ("stat file:///…").
func TestMixtureSourceURLs(t *testing.T) {
	web, coco, own := mixCorpus(t, 300, "jsonl", 0), mixCorpus(t, 100, "wds", 0), mixCorpus(t, 40, "jsonl", 0)
	srv := httptest.NewServer(http.FileServer(http.Dir(coco)))
	defer srv.Close()
	endpoint := fakeS3(t, "data")
	q := fmt.Sprintf("?endpoint=%s&region=us-east-1&use_path_style=true&disable_https=true", endpoint)
	uploadDir(t, "s3://data/own"+q, filepath.Dir(own))
	local := [3]string{web, coco, own}
	urls := [3]string{"file://" + web, srv.URL + "/shard-000000.tar", "s3://data/own/" + filepath.Base(own) + q}

	wantIDs, wantItems, wantHash := mixtureEpoch(t, local)
	for i, name := range []string{"file", "http", "s3"} {
		t.Run(name, func(t *testing.T) {
			paths := local
			paths[i] = urls[i]
			ids, items, hash := mixtureEpoch(t, paths)
			if len(ids) == 0 || !slices.Equal(ids, wantIDs) {
				t.Fatalf("%s: %d draws, want the local paths' %d (same ids in order: %v)", urls[i], len(ids), len(wantIDs), slices.Equal(ids, wantIDs))
			}
			if !slices.Equal(items, wantItems) {
				t.Errorf("%s: planner items differ from the local paths'", urls[i])
			}
			if hash != wantHash {
				t.Errorf("%s: plan hash %s, want %s", urls[i], hash, wantHash)
			}
		})
	}
}

// mixtureEpoch prepares a 6:3:1 mixture of paths (web, coco, own) and
// returns its draw ids, its items and its plan's hash.
func mixtureEpoch(t *testing.T, paths [3]string) ([]string, []balancer.Item, string) {
	t.Helper()
	yaml := fmt.Sprintf("sources:\n  - {name: web, path: %q, weight: 6}\n  - {name: coco, path: %q, weight: 3}\n  - {name: own, path: %q, weight: 1}\n",
		paths[0], paths[1], paths[2])
	p := filepath.Join(t.TempDir(), "mix.yaml")
	mustOK(t, os.WriteFile(p, []byte(yaml), 0o644))
	m, err := loader.LoadMixture(p)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("")
	cfg.Mixture, cfg.InputCache = m, t.TempDir()
	prep, err := Prepare(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("Prepare(%v): %v", paths, err)
	}
	defer func() { mustOK(t, prep.Close()) }()
	plan, err := prep.Plan(balancer.StrategyMmfeed)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(prep.Features.Items))
	for i, it := range prep.Features.Items {
		ids[i] = it.ID
	}
	return ids, slices.Clone(prep.Features.Items), plan.Hash()
}
