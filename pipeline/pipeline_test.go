package pipeline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/mmfeed/mmfeed/internal/testpeer"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/float16"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/loader/synth"
)

// corpus generates a skewed corpus with deliberately bad samples, once per test binary.
func corpus(t *testing.T, n int, format string) string {
	t.Helper()
	cfg := synth.DefaultConfig()
	cfg.Out, cfg.Samples, cfg.Seed, cfg.Format, cfg.BadFraction = t.TempDir(), n, 42, format, 0.08
	sum, err := synth.Generate(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return sum.Path
}

func testConfig(input string) Config {
	c := DefaultConfig()
	c.Input = input
	c.Plan.DP, c.Plan.MicroBatches, c.Plan.GlobalBatch = 4, 2, 32
	c.Image.Size = 32 // small tensors keep the test fast
	c.Image.PatchSize = 16
	c.Workers = 2
	return c
}

// TestShardAccountsForEverySample is the end-to-end invariant of `mmfeed shard`: every
// sample the source held is planned exactly once (weight 1), quarantined with a reason,
// or dropped at the tail; every rank file has the same number of record batches; the
// files read back with the proto schema.
func TestShardAccountsForEverySample(t *testing.T) {
	for _, format := range []string{"jsonl", "wds"} {
		t.Run(format, func(t *testing.T) {
			input := corpus(t, 300, format)
			out := t.TempDir()
			qf, _ := os.Create(filepath.Join(out, "quarantine.jsonl"))
			prep, err := Prepare(context.Background(), testConfig(input), qf)
			if err != nil {
				t.Fatal(err)
			}
			defer prep.Close()
			plan, err := prep.Plan(balancer.StrategyMmfeed)
			if err != nil {
				t.Fatal(err)
			}
			sum, err := WriteShards(context.Background(), prep, plan, out, nil)
			if err != nil {
				t.Fatal(err)
			}
			qf.Close()

			real := map[string]int{}
			batches := make([]int, len(sum.Files))
			for r, f := range sum.Files {
				batches[r] = readShard(t, f, func(id string, w float32) {
					if w > 0 {
						real[id]++
					}
				})
			}
			for r := range batches {
				if batches[r] != batches[0] {
					t.Errorf("rank %d has %d record batches, rank 0 has %d", r, batches[r], batches[0])
				}
			}
			if want := len(plan.Steps) * 2; batches[0] != want {
				t.Errorf("rank 0 has %d record batches, want steps×micro-batches = %d", batches[0], want)
			}
			for id, n := range real {
				if n != 1 {
					t.Errorf("sample %s delivered %d times with weight 1", id, n)
				}
			}
			quarantined := countLines(t, filepath.Join(out, "quarantine.jsonl"))
			seen := int(prep.Seen())
			if got := len(real) + quarantined + len(plan.Dropped); got != seen {
				t.Errorf("planned %d + quarantined %d + dropped %d = %d, want samples seen %d",
					len(real), quarantined, len(plan.Dropped), got, seen)
			}
			if quarantined == 0 {
				t.Errorf("a corpus with bad samples quarantined nothing")
			}
		})
	}
}

// readShard calls row for every row of a rank file and returns its record batch count.
func readShard(t *testing.T, path string, row func(id string, weight float32)) int {
	return readShardPixels(t, path, func(id string, w float32, _ []float16.Num) { row(id, w) })
}

func readShardPixels(t *testing.T, path string, row func(id string, weight float32, px []float16.Num)) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	r, err := ipc.NewFileReader(f, ipc.WithAllocator(mem))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range r.NumRecords() {
		rec, err := r.RecordBatch(i)
		if err != nil {
			t.Fatal(err)
		}
		ids := rec.Column(int(rec.Schema().FieldIndices("id")[0])).(*array.String)
		ws := rec.Column(int(rec.Schema().FieldIndices("weight")[0])).(*array.Float32)
		px := rec.Column(int(rec.Schema().FieldIndices("pixel_values")[0])).(*array.List)
		vals := px.ListValues().(*array.Float16).Values()
		for j := range ids.Len() {
			lo, hi := px.ValueOffsets(j)
			row(ids.Value(j), ws.Value(j), vals[lo:hi])
		}
	}
	return r.NumRecords()
}

func countLines(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r loader.Reject
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Reason == "" {
			t.Errorf("quarantine line %q: want a reject with a reason (%v)", sc.Text(), err)
		}
		n++
	}
	return n
}

// TestShardReadsWithPyarrow reads a written shard with pyarrow and numpy and checks the
// float16 pixels equal what arrow-go wrote.
func TestShardReadsWithPyarrow(t *testing.T) {
	py := testpeer.Python(t)
	input := corpus(t, 80, "jsonl")
	out := t.TempDir()
	prep, err := Prepare(context.Background(), testConfig(input), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prep.Close()
	plan, err := prep.Plan(balancer.StrategyMmfeed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WriteShards(context.Background(), prep, plan, out, nil); err != nil {
		t.Fatal(err)
	}
	script := `
import sys, json, numpy as np, pyarrow.ipc as ipc
r = ipc.open_file(sys.argv[1])
rows, s = 0, 0.0
for i in range(r.num_record_batches):
    b = r.get_batch(i)
    meta = b.schema.field("pixel_values").metadata
    shape = json.loads(meta[b"shape"])
    for px in b.column("pixel_values"):
        a = np.asarray(px.values.to_numpy(zero_copy_only=False), dtype=np.float16).reshape(shape)
        s += float(a.astype(np.float64).sum()); rows += 1
print(json.dumps({"rows": rows, "sum": s}))
`
	cmdOut, err := exec.Command(py, "-c", script, filepath.Join(out, RankFile(0))).CombinedOutput()
	if err != nil {
		t.Fatalf("pyarrow: %v\n%s", err, cmdOut)
	}
	var got struct {
		Rows int
		Sum  float64
	}
	if err := json.Unmarshal(cmdOut, &got); err != nil {
		t.Fatalf("%s: %v", cmdOut, err)
	}
	var wantRows int
	var wantSum float64
	readShardPixels(t, filepath.Join(out, RankFile(0)), func(_ string, _ float32, px []float16.Num) {
		wantRows++
		for _, v := range px {
			wantSum += float64(v.Float32())
		}
	})
	if got.Rows != wantRows || got.Rows == 0 {
		t.Errorf("pyarrow read %d rows, arrow-go %d", got.Rows, wantRows)
	}
	if math.Abs(got.Sum-wantSum) > 1e-6*math.Max(1, math.Abs(wantSum)) {
		t.Errorf("pyarrow pixel sum %v, arrow-go %v", got.Sum, wantSum)
	}
}

// TestPlanRejectionsQuarantinedOnce: shard calls Plan and then Report; the planner's
// rejections (samples alone over the micro-batch budget) must reach the quarantine once.
func TestPlanRejectionsQuarantinedOnce(t *testing.T) {
	cfg := testConfig(corpus(t, 120, "jsonl"))
	cfg.Plan.Budget.MaxPaddedTokens = 100 // long captions alone exceed it
	var q bytes.Buffer
	prep, err := Prepare(context.Background(), cfg, &q)
	if err != nil {
		t.Fatal(err)
	}
	defer prep.Close()
	plan, err := prep.Plan(cfg.Plan.Strategy)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Rejected) == 0 {
		t.Fatal("no planner rejections; the budget should reject long captions")
	}
	rep, err := prep.Report()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	rejects, err := loader.ReadQuarantine(&q)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rejects {
		if r.Reason == "plan_rejected" {
			seen[r.ID]++
		}
	}
	if len(seen) != len(plan.Rejected) {
		t.Errorf("%d distinct plan_rejected ids in quarantine, planner rejected %d", len(seen), len(plan.Rejected))
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("sample %s quarantined %d times", id, n)
		}
	}
	if rep.Quarantined != len(rejects) {
		t.Errorf("report counts %d quarantined, the quarantine holds %d", rep.Quarantined, len(rejects))
	}
}

func TestPrepareProgress(t *testing.T) {
	cfg := testConfig(corpus(t, 150, "jsonl"))
	var mu sync.Mutex
	var seen []int
	total := -1
	cfg.Progress = func(done, n int) {
		mu.Lock()
		defer mu.Unlock()
		if total >= 0 && n != total {
			t.Errorf("total changed from %d to %d", total, n)
		}
		total, seen = n, append(seen, done)
	}
	prep, err := Prepare(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prep.Close()
	slices.Sort(seen)
	want := []int{64, 128, total}
	if total < 129 || total > 150 || !slices.Equal(seen, want) {
		t.Errorf("progress %v of %d, want %v (every 64 entries and the end)", seen, total, want)
	}
}
