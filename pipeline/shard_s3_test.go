package pipeline

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/internal/testpeer"
)

// fakeS3 starts an in-process S3 server on loopback with one bucket and points the AWS
// credentials of this process (and its children) at it. Nothing leaves the machine.
func fakeS3(t *testing.T, bucket string) (endpoint string) {
	t.Helper()
	backend := s3mem.New()
	if err := backend.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(srv.Close)
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required", "AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		t.Setenv(k, v)
	}
	return srv.URL
}

// TestShardOnS3 writes a two-epoch set to an S3 prefix, crashes and resumes there, and
// reads it back with the Python ShardSet (what ShardSource uses) through pyarrow's S3
// filesystem. uint8 tensors keep torch out of the child process (JPEG reading is tested
// in trainer/tests/test_shardset.py).
func TestShardOnS3(t *testing.T) {
	py := testpeer.Python(t)
	endpoint := fakeS3(t, "data")
	url := fmt.Sprintf("s3://data/sets/demo?endpoint=%s&region=us-east-1&use_path_style=true&disable_https=true", endpoint)
	cfg := testConfig(corpus(t, 120, "jsonl"))
	cfg.Image.DType = "uint8"
	o := DefaultShardOptions()
	o.Epochs, o.PartSteps = 2, 1
	if _, _, err := runShard(t, cfg, url, o, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted run: got %v, want context.Canceled", err)
	}
	sum, _, err := runShard(t, cfg, url, o, 0)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Reused < cfg.Plan.DP {
		t.Errorf("resumed on S3 kept %d files, want at least the first part's %d", sum.Reused, cfg.Plan.DP)
	}
	st, err := OpenStore(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b, err := st.ReadAll(context.Background(), manifestFile)
	if err != nil {
		t.Fatal(err)
	}
	var m ShardManifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	_, file, _, _ := runtime.Caller(0)
	script := `
import json, sys
from mmfeed_trainer.shardset import ShardSet
s = ShardSet(sys.argv[1])
rows = {}
for e in sorted(s.epochs):
    for _, records in s.rank_steps(e, 0):
        for rb in records:
            assert rb.schema.field("pixel_values").metadata[b"dtype"] == b"uint8"
            rows[e] = rows.get(e, 0) + rb.num_rows
print(json.dumps({"read": rows, "indexed": {e: len(s.index(e, 0)["id"]) for e in s.epochs}}))
`
	host := strings.TrimPrefix(endpoint, "http://")
	cmd := exec.Command(py, "-c", script, "s3://data/sets/demo?endpoint_override="+host+"&scheme=http&region=us-east-1")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(filepath.Dir(file), "..", "trainer"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python ShardSource on S3: %v\n%s", err, out)
	}
	var got struct{ Read, Indexed map[int]int }
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if len(got.Read) != len(m.Epochs) || fmt.Sprint(got.Read) != fmt.Sprint(got.Indexed) {
		t.Errorf("rank 0 rows per epoch read from S3: %v, its indexes list %v, manifest %d epochs", got.Read, got.Indexed, len(m.Epochs))
	}
}

// TestStageInputFromS3 uploads a corpus to the fake S3, stages it back by the manifest's
// URL, and checks the copy is byte-identical and plans exactly like the original.
func TestStageInputFromS3(t *testing.T) {
	endpoint := fakeS3(t, "data")
	q := fmt.Sprintf("?endpoint=%s&region=us-east-1&use_path_style=true&disable_https=true", endpoint)
	input := corpus(t, 60, "jsonl")
	src := filepath.Dir(input)
	ctx := context.Background()
	st, err := OpenStore(ctx, "s3://data/corpora/synth"+q)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var files []string
	err = filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		files = append(files, rel)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return st.WriteFile(ctx, filepath.ToSlash(rel), func(w io.Writer) error { _, err := w.Write(b); return err })
	})
	if err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	url := "s3://data/corpora/synth/" + filepath.Base(input) + q
	for range 2 { // the second staging finds everything in place
		local, err := StageInput(ctx, url, cache)
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(cache, "corpora", "synth", filepath.Base(input)); local != want {
			t.Fatalf("staged at %s, want %s", local, want)
		}
	}
	for _, rel := range files {
		a, _ := os.ReadFile(filepath.Join(src, rel))
		b, err := os.ReadFile(filepath.Join(cache, "corpora", "synth", rel))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s: staged copy differs (%v)", rel, err)
		}
	}
	if _, err := StageInput(ctx, "s3://data/nothing/here"+q, cache); err == nil {
		t.Error("staging an empty prefix succeeded")
	}
	plans := make([]string, 2)
	for i, in := range []string{input, filepath.Join(cache, "corpora", "synth", filepath.Base(input))} {
		prep, err := Prepare(ctx, testConfig(in), nil)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := prep.Plan(balancer.StrategyMmfeed)
		if err != nil {
			t.Fatal(err)
		}
		plans[i] = plan.Hash()
		prep.Close()
	}
	if plans[0] != plans[1] {
		t.Errorf("plan of the staged copy %.12s differs from the original's %.12s", plans[1], plans[0])
	}
}

// TestStreamInputFromS3 uploads WebDataset shards (and gzipped copies) to the fake S3
// and shards them from there by prefix and by object: nothing is staged, and the plan
// equals the local one.
func TestStreamInputFromS3(t *testing.T) {
	endpoint := fakeS3(t, "data")
	q := fmt.Sprintf("?endpoint=%s&region=us-east-1&use_path_style=true&disable_https=true", endpoint)
	local := corpus(t, 60, "wds")
	ctx := context.Background()
	st, err := OpenStore(ctx, "s3://data/wds"+q)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	shards, _ := filepath.Glob(filepath.Join(local, "*.tar"))
	if len(shards) == 0 {
		t.Fatalf("no shards in %s", local)
	}
	for _, p := range shards {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.WriteFile(ctx, filepath.Base(p), func(w io.Writer) error { _, err := w.Write(b); return err }); err != nil {
			t.Fatal(err)
		}
		if err := st.WriteFile(ctx, "gz/"+filepath.Base(p)+".gz", func(w io.Writer) error {
			zw := gzip.NewWriter(w)
			if _, err := zw.Write(b); err != nil {
				return err
			}
			return zw.Close()
		}); err != nil {
			t.Fatal(err)
		}
	}
	cache := t.TempDir()
	hashes := map[string]string{}
	urls := []string{"s3://data/wds/gz" + q, "s3://data/wds/" + filepath.Base(shards[0]) + q, "s3://data/wds/gz/" + filepath.Base(shards[0]) + ".gz" + q}
	for _, url := range urls {
		in, err := OpenInput(ctx, url, cache)
		if err != nil {
			t.Fatal(err)
		}
		if in.Remote == nil || in.Staged {
			t.Fatalf("%s: got %+v, want a streamed input", url, in)
		}
		cfg := testConfig(in.Path)
		cfg.Loader.Remote = in.Remote
		sum, prep, err := runShard(t, cfg, t.TempDir(), DefaultShardOptions(), 0)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := prep.Plan(balancer.StrategyMmfeed)
		if err != nil {
			t.Fatal(err)
		}
		hashes[url] = plan.Hash()
		if sum.Rows == 0 {
			t.Errorf("%s: no rows written", url)
		}
		mustOK(t, in.Close())
	}
	if entries, _ := os.ReadDir(cache); len(entries) != 0 {
		t.Errorf("the input cache holds %d entries, want none (streamed)", len(entries))
	}
	prep, err := Prepare(ctx, testConfig(local), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prep.Close()
	plan, err := prep.Plan(balancer.StrategyMmfeed)
	if err != nil {
		t.Fatal(err)
	}
	for _, url := range urls {
		if len(shards) == 1 && hashes[url] != plan.Hash() {
			t.Errorf("plan from %s %.12s, local %.12s", url, hashes[url], plan.Hash())
		}
	}
	in, err := OpenInput(ctx, "s3://data/wds/nothing.jsonl"+q, cache)
	if err == nil || in.Remote != nil {
		t.Errorf("a manifest URL: got %+v, %v; want staging (which fails: no such object)", in, err)
	}
}

// TestStreamInputFromHTTP shards WebDataset shards served over HTTP (a brace pattern and
// one gzipped shard), with ranged GETs for the images: the plan equals the local one.
func TestStreamInputFromHTTP(t *testing.T) {
	local := corpus(t, 60, "wds")
	shard := filepath.Join(local, "shard-000000.tar")
	b, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(b)
	zw.Close()
	mustOK(t, os.WriteFile(shard+".gz", gz.Bytes(), 0o644))
	var ranged atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Range") != "" {
			ranged.Add(1)
		}
		http.FileServer(http.Dir(local)).ServeHTTP(w, r)
	}))
	defer srv.Close()
	ctx := context.Background()
	prep, err := Prepare(ctx, testConfig(shard), nil) // the .tar alone (the folder now holds its .tar.gz copy too)
	if err != nil {
		t.Fatal(err)
	}
	defer prep.Close()
	want, err := prep.Plan(balancer.StrategyMmfeed)
	if err != nil {
		t.Fatal(err)
	}
	for _, url := range []string{srv.URL + "/shard-{000000..000000}.tar", srv.URL + "/shard-000000.tar.gz"} {
		in, err := OpenInput(ctx, url, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		cfg := testConfig(in.Path)
		cfg.Loader.Remote = in.Remote
		sum, p, err := runShard(t, cfg, t.TempDir(), DefaultShardOptions(), 0)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := p.Plan(balancer.StrategyMmfeed)
		if err != nil {
			t.Fatal(err)
		}
		if plan.Hash() != want.Hash() || sum.Rows == 0 {
			t.Errorf("%s: plan %.12s (%d rows), local %.12s", url, plan.Hash(), sum.Rows, want.Hash())
		}
	}
	if ranged.Load() == 0 {
		t.Error("no ranged GET: images were not re-read by range")
	}
	if _, err := OpenInput(ctx, srv.URL+"/manifest.jsonl", t.TempDir()); err == nil {
		t.Error("an http manifest URL was accepted, want an error naming shards")
	}
}
