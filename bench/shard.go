package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/proto"
)

// shardModes are the stores benchShard compares: name, store, dtype.
var shardModes = []struct{ name, store, dtype string }{
	{"float16", pipeline.StoreTensor, proto.DTypeFloat16},
	{"uint8", pipeline.StoreTensor, proto.DTypeUint8},
	{"jpeg", pipeline.StoreJPEG, proto.DTypeUint8},
}

// benchShard: bytes per stored sample of each store mode (zstd) on every third sample of
// the real corpus, 224 px shorter-crop, two epochs planned; the Python reader's samples/s
// per core (CPU time, one torch thread, ShardSet.rank_steps + record_to_batch, the JPEG decode
// included) for the first epoch (whole records) and the second (rows gathered through the
// index); and the PSNR of the JPEG store against the uint8 tensors of the same rows.
func benchShard(env *benchEnv) (map[string]float64, error) {
	input, label, err := shardBenchInput(env)
	if err != nil {
		return nil, err
	}
	prev := runtime.GOMAXPROCS(runtime.NumCPU()) // writing is not what is measured
	defer runtime.GOMAXPROCS(prev)
	res := map[string]float64{}
	dirs := map[string]string{}
	for _, m := range shardModes {
		dir := filepath.Join(env.tmp, "shard-"+m.name)
		rows, bytes, err := writeBenchShard(input, dir, m.store, m.dtype)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.name, err)
		}
		dirs[m.name] = dir
		res["shard_bytes_per_sample_"+m.name] = float64(bytes) / float64(rows)
		fmt.Printf("   %s corpus, %s: %d rows, %.1f KB per sample\n", label, m.name, rows, float64(bytes)/float64(rows)/1e3)
	}
	runtime.GOMAXPROCS(prev)
	out, err := exec.Command("taskset", "-c", "0", env.python, "-c", shardReadScript,
		dirs["float16"], dirs["uint8"], dirs["jpeg"]).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("python reader: %v\n%s", err, out)
	}
	var py map[string]float64
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &py); err != nil {
		return nil, fmt.Errorf("python reader output: %v\n%s", err, out)
	}
	for k, v := range py {
		res[k] = v
	}
	return res, nil
}

// shardBenchInput is every third sample of the real corpus (all its sources), or 600
// generated ones.
func shardBenchInput(env *benchEnv) (string, string, error) {
	if env.corpus == "" {
		return benchInput(env, 600)
	}
	src := filepath.Join(env.corpus, "dev", "manifest.jsonl")
	f, err := os.Open(src)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	dst := filepath.Join(env.tmp, "shard-manifest.jsonl")
	out, err := os.Create(dst)
	if err != nil {
		return "", "", err
	}
	defer out.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for i := 0; sc.Scan(); i++ {
		var l map[string]any
		if i%3 != 0 || json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		if p, ok := l["image"].(string); ok && !filepath.IsAbs(p) {
			l["image"] = filepath.Join(filepath.Dir(src), p)
		}
		b, _ := json.Marshal(l)
		fmt.Fprintf(out, "%s\n", b)
	}
	return dst, "real (every 3rd sample)", sc.Err()
}

// writeBenchShard writes a two-epoch shard set and returns its stored rows and data bytes.
func writeBenchShard(input, dir, store, dtype string) (int, int64, error) {
	cfg := pipeline.DefaultConfig()
	cfg.Input = input
	cfg.Image.DType = dtype
	cfg.Loader.AllowAbsolute = true // the subset manifest names the corpus images
	cfg.Plan.DP, cfg.Plan.GlobalBatch, cfg.Plan.MicroBatches = 2, 32, 2
	qf, err := os.Create(dir + "-quarantine.jsonl")
	if err != nil {
		return 0, 0, err
	}
	defer qf.Close()
	ctx := context.Background()
	prep, err := pipeline.Prepare(ctx, cfg, qf)
	if err != nil {
		return 0, 0, err
	}
	defer prep.Close()
	plan, err := prep.Plan(balancer.StrategyMmfeed)
	if err != nil {
		return 0, 0, err
	}
	st, err := pipeline.OpenStore(ctx, dir)
	if err != nil {
		return 0, 0, err
	}
	defer st.Close()
	o := pipeline.DefaultShardOptions()
	o.Store, o.Epochs = store, 2
	sum, err := pipeline.Shard(ctx, prep, plan, st, o, nil)
	if err != nil {
		return 0, 0, err
	}
	var data int64
	for _, f := range sum.Files {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			return 0, 0, err
		}
		data += st.Size()
	}
	return sum.Rows, data, nil
}

// shardReadScript reads every rank of each set (argv: float16, uint8, jpeg folders) and
// prints one JSON object: samples/s per core per mode and epoch, and the JPEG PSNR.
const shardReadScript = `
import json, sys, time
import numpy as np, torch
torch.set_num_threads(1)
import torchvision.io  # imported before timing: a one-off second
from mmfeed_trainer.shardset import ShardSet
from mmfeed_trainer.batches import record_to_batch

def steps(d, r, epoch):
    return ShardSet(d).rank_steps(epoch, r)

def read(d, epoch):
    n, t = 0, time.process_time()
    for r in range(2):
        for _, records in steps(d, r, epoch):
            for rb in records:
                record_to_batch(rb)
                n += rb.num_rows
    return n / (time.process_time() - t)

out = {}
for mode, d in zip(("float16", "uint8", "jpeg"), sys.argv[1:]):
    out["shard_read_samples_per_s_" + mode] = read(d, 0)
    out["shard_read_samples_per_s_" + mode + "_epoch1"] = read(d, 1)

psnr = []
for r in range(2):
    for (_, ka), (_, kb) in zip(steps(sys.argv[2], r, 0), steps(sys.argv[3], r, 0), strict=True):
        for ra, rb in zip(ka, kb, strict=True):
            assert ra.column("id").equals(rb.column("id"))
            pa_, pb = ra.column("pixel_values"), rb.column("pixel_values")
            w = ra.column("weight").to_numpy()
            for i in range(len(pa_)):
                if w[i] == 0:
                    continue
                x = pa_[i].values.to_numpy().astype(np.float64)
                y = pb[i].values.to_numpy().astype(np.float64)
                mse = np.mean((x - y) ** 2)
                psnr.append(99.0 if mse == 0 else 10 * np.log10(255.0 ** 2 / mse))
psnr = np.array(psnr)
out["shard_jpeg_psnr_db_median"] = float(np.median(psnr))
out["shard_jpeg_psnr_db_p05"] = float(np.percentile(psnr, 5))
out["shard_jpeg_psnr_samples"] = float(len(psnr))
print(json.dumps(out))
`
