package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image/jpeg"
	"os"
	"path/filepath"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/proto"
)

// runShard prepares input with cfg and shards it into dir with o; cancelAfter > 0
// cancels the run after that many written steps (a crash).
func runShard(t *testing.T, cfg Config, dir string, o ShardOptions, cancelAfter int) (ShardSummary, *Prepared, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prep, err := Prepare(ctx, cfg, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prep.Close() })
	plan, err := prep.Plan(balancer.StrategyMmfeed)
	if err != nil {
		t.Fatal(err)
	}
	st, err := OpenStore(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var progress func(done, total int)
	if cancelAfter > 0 {
		progress = func(done, _ int) {
			if done >= cancelAfter {
				cancel()
			}
		}
	}
	sum, err := Shard(ctx, prep, plan, st, o, progress)
	return sum, prep, err
}

func readManifest(t *testing.T, dir string) ShardManifest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err != nil {
		t.Fatal(err)
	}
	var m ShardManifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// readRecords returns every record of an Arrow IPC file (the caller releases them).
func readRecords(t *testing.T, path string, mem memory.Allocator) []arrow.RecordBatch {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := ipc.NewFileReader(f, ipc.WithAllocator(mem))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out []arrow.RecordBatch
	for i := range r.NumRecords() {
		rec, err := r.RecordBatch(i)
		if err != nil {
			t.Fatal(err)
		}
		rec.Retain()
		out = append(out, rec)
	}
	return out
}

// TestShardEpochIndexes: whatever the store and codec, the samples are written once and
// every epoch's index places each planned sample exactly once with weight 1, pointing at
// a stored row of that sample; the ranks get equal steps and micro-batches; JPEG rows
// decode to the planned shape; records hold at most RecordRows rows (default 1).
func TestShardEpochIndexes(t *testing.T) {
	input := corpus(t, 200, "jsonl")
	for _, tc := range []struct {
		store, dtype, codec   string
		partSteps, recordRows int
	}{
		{StoreTensor, proto.DTypeFloat16, CompressZstd, 0, 0},
		{StoreTensor, proto.DTypeUint8, CompressLZ4, 2, 3},
		{StoreJPEG, proto.DTypeUint8, CompressNone, 3, 1 << 20},
	} {
		t.Run(tc.store+"-"+tc.dtype+"-"+tc.codec, func(t *testing.T) {
			cfg := testConfig(input)
			cfg.Image.DType = tc.dtype
			o := DefaultShardOptions()
			o.Store, o.Compression, o.Epochs, o.PartSteps, o.RecordRows = tc.store, tc.codec, 3, tc.partSteps, tc.recordRows
			dir := t.TempDir()
			sum, prep, err := runShard(t, cfg, dir, o, 0)
			if err != nil {
				t.Fatal(err)
			}
			m := readManifest(t, dir)
			if len(m.Epochs) != 3 || m.Store != tc.store || m.Compression != tc.codec {
				t.Fatalf("manifest: %d epochs, store %s, codec %s", len(m.Epochs), m.Store, m.Compression)
			}
			mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
			defer mem.AssertSize(t, 0)
			data := make([][]arrow.RecordBatch, len(m.Files))
			stored := map[string]int{} // real rows per id over the data files
			for i, f := range m.Files {
				data[i] = readRecords(t, filepath.Join(dir, f.Path), mem)
				for _, rec := range data[i] {
					checkStoredRecord(t, rec, tc.store, stored)
					if rows := int(rec.NumRows()); rows > max(tc.recordRows, 1) {
						t.Errorf("%s: a record of %d rows, want at most %d", f.Path, rows, max(tc.recordRows, 1))
					}
				}
			}
			defer func() {
				for _, recs := range data {
					for _, r := range recs {
						r.Release()
					}
				}
			}()
			for id, n := range stored {
				if n > 1 {
					t.Errorf("sample %s stored %d times", id, n)
				}
			}
			for _, e := range m.Epochs {
				checkEpochIndex(t, filepath.Join(dir, e.Path), e, m, data, mem)
			}
			if sum.Reused != 0 || len(sum.Epochs) != 3 || prep.Quarantine.Total() == 0 {
				t.Errorf("summary %+v, quarantined %d", sum, prep.Quarantine.Total())
			}
		})
	}
}

func checkStoredRecord(t *testing.T, rec arrow.RecordBatch, store string, stored map[string]int) {
	t.Helper()
	meta, err := proto.ValidateRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	if meta.VocabSize != 30522 || meta.PadID != 0 { // bert-base-uncased
		t.Errorf("shard record carries vocab %d, pad %d; want the tokenizer's 30522, 0", meta.VocabSize, meta.PadID)
	}
	ids := rec.Column(0).(*array.String)
	w := rec.Column(rec.Schema().FieldIndices(proto.ColWeight)[0]).(*array.Float32)
	px := rec.Column(rec.Schema().FieldIndices(proto.ColPixelValues)[0]).(*array.List)
	ps := rec.Column(rec.Schema().FieldIndices(proto.ColPixelShape)[0]).(*array.FixedSizeList)
	for i := range int(rec.NumRows()) {
		if w.Value(i) > 0 {
			stored[ids.Value(i)]++
		}
		if store != StoreJPEG {
			continue
		}
		s, e := px.ValueOffsets(i)
		img, err := jpeg.Decode(bytes.NewReader(px.ListValues().(*array.Uint8).Uint8Values()[s:e]))
		if err != nil {
			t.Fatalf("row %s: %v", ids.Value(i), err)
		}
		shape := ps.ListValues().(*array.Int32).Int32Values()[3*i : 3*i+3]
		if b := img.Bounds(); b.Dy() != int(shape[1]) || b.Dx() != int(shape[2]) {
			t.Errorf("row %s decodes to %v, pixel_shape %v", ids.Value(i), b, shape)
		}
	}
}

// checkEpochIndex: equal steps × micro-batches per rank; each real sample once; every
// row's location holds the same id.
func checkEpochIndex(t *testing.T, path string, info EpochIndexInfo, m ShardManifest, data [][]arrow.RecordBatch, mem memory.Allocator) {
	t.Helper()
	recs := readRecords(t, path, mem)
	defer func() {
		for _, r := range recs {
			r.Release()
		}
	}()
	if len(recs) != m.DP {
		t.Fatalf("epoch %d index has %d records, want dp %d", info.Epoch, len(recs), m.DP)
	}
	real := map[string]int{}
	for r, rec := range recs {
		ids := rec.Column(0).(*array.String)
		steps := rec.Column(1).(*array.Int32)
		mbs := rec.Column(2).(*array.Int32)
		units := map[[2]int32]bool{}
		for i := range int(rec.NumRows()) {
			units[[2]int32{steps.Value(i), mbs.Value(i)}] = true
			file, record, row := rec.Column(3).(*array.Int32).Value(i), rec.Column(4).(*array.Int32).Value(i), rec.Column(5).(*array.Int32).Value(i)
			got := data[file][record].Column(0).(*array.String).Value(int(row))
			if got != ids.Value(i) {
				t.Fatalf("epoch %d rank %d row %d: index id %s, stored row holds %s", info.Epoch, r, i, ids.Value(i), got)
			}
			if rec.Column(6).(*array.Float32).Value(i) > 0 {
				real[ids.Value(i)]++
			}
		}
		if want := info.Steps * m.MicroBatch; len(units) != want {
			t.Errorf("epoch %d rank %d: %d (step, micro-batch) units, want %d", info.Epoch, r, len(units), want)
		}
	}
	for id, n := range real {
		if n != 1 {
			t.Errorf("epoch %d: sample %s planned %d times", info.Epoch, id, n)
		}
	}
	if len(real) != info.Samples {
		t.Errorf("epoch %d: %d real samples, manifest says %d", info.Epoch, len(real), info.Samples)
	}
}

// TestShardResumes: a run cancelled mid-way and run again keeps the parts it finished
// (verified by hash) and ends with the same files an uninterrupted run writes; a
// different run into the same output is refused.
func TestShardResumes(t *testing.T) {
	cfg := testConfig(corpus(t, 200, "jsonl"))
	o := DefaultShardOptions()
	o.Epochs, o.PartSteps = 2, 1
	whole := t.TempDir()
	if _, _, err := runShard(t, cfg, whole, o, 0); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, _, err := runShard(t, cfg, dir, o, 2); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted run: got %v, want context.Canceled", err)
	}
	if _, err := os.Stat(filepath.Join(dir, manifestFile)); err == nil {
		t.Fatal("an interrupted run wrote shard.json")
	}
	// Corrupt one finished file: it must be rewritten, not trusted.
	bad := filepath.Join(dir, PartRankFile(0, 1))
	if err := os.WriteFile(bad, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, _, err := runShard(t, cfg, dir, o, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := cfg.Plan.DP - 1; sum.Reused < want {
		t.Errorf("resumed run kept %d files, want at least %d (part 0 minus the corrupted file's part)", sum.Reused, want)
	}
	a, b := readManifest(t, whole), readManifest(t, dir)
	if len(a.Files) != len(b.Files) {
		t.Fatalf("files: %d vs %d", len(a.Files), len(b.Files))
	}
	for i := range a.Files {
		if a.Files[i] != b.Files[i] {
			t.Errorf("file %d: uninterrupted %+v, resumed %+v", i, a.Files[i], b.Files[i])
		}
	}
	for i := range a.Epochs {
		if a.Epochs[i] != b.Epochs[i] {
			t.Errorf("epoch %d: uninterrupted %+v, resumed %+v", i, a.Epochs[i], b.Epochs[i])
		}
	}
	o.Store, cfg.Image.DType = StoreJPEG, proto.DTypeUint8
	if _, _, err := runShard(t, cfg, dir, o, 0); !errors.Is(err, ErrShardMismatch) {
		t.Errorf("a different run into the same output: got %v, want ErrShardMismatch", err)
	}
}

func TestShardOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*ShardOptions)
		dtype string
	}{
		{"jpeg needs uint8", func(o *ShardOptions) { o.Store = StoreJPEG }, proto.DTypeFloat16},
		{"unknown store", func(o *ShardOptions) { o.Store = "png" }, proto.DTypeUint8},
		{"quality", func(o *ShardOptions) { o.JPEGQuality = 0 }, proto.DTypeUint8},
		{"codec", func(o *ShardOptions) { o.Compression = "gzip" }, proto.DTypeUint8},
		{"epochs", func(o *ShardOptions) { o.Epochs = 0 }, proto.DTypeUint8},
		{"part steps", func(o *ShardOptions) { o.PartSteps = -1 }, proto.DTypeUint8},
	} {
		o := DefaultShardOptions()
		tc.edit(&o)
		if err := o.Validate(tc.dtype); err == nil {
			t.Errorf("%s: %+v accepted", tc.name, o)
		}
	}
	if err := DefaultShardOptions().Validate(proto.DTypeFloat16); err != nil {
		t.Errorf("defaults: %v", err)
	}
}
