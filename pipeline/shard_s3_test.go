package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

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
