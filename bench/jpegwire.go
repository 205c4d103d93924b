package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/proto"
)

// jpegWireModes are the pixel dtypes benchJPEGWire compares (key, dtype, decode mode); uint8
// is the exact reference of the PSNR, jpeg_fast the jpeg wire with --decode fast, jpeg_reduce
// with --decode reduce (the lossy worker path: n/8 DCT scale, box reduce).
var jpegWireModes = []struct{ key, dtype, decode string }{
	{"float16", imgproc.DTypeFloat16, imgproc.DecodeExact},
	{"uint8", imgproc.DTypeUint8, imgproc.DecodeExact},
	{"jpeg", imgproc.DTypeJPEG, imgproc.DecodeExact},
	{"jpeg_fast", imgproc.DTypeJPEG, imgproc.DecodeFast},
	{"jpeg_reduce", imgproc.DTypeJPEG, imgproc.DecodeReduce},
	{"jpeg_source", imgproc.DTypeJPEGSource, imgproc.DecodeExact},
}

// jpegWireSamples caps the samples of each input (the real corpus's large images take
// about 0.1 CPU-s each to decode).
const jpegWireSamples = 160

// benchJPEGWire: what a worker spends per sample under each pixel dtype — the CPU seconds
// of Preprocessor.Run (read, tokenize, decode, resize, encode the pixels; one goroutine,
// one core; jpeg_fast and jpeg_reduce: the jpeg dtype with --decode fast or reduce) plus
// proto.BuildRecord and EncodeIPC of every micro-batch of 16 (no transport; the median of
// jpegWireRoundCount interleaved rounds) —
// and the Arrow IPC bytes per sample that go on the wire, on the same plan of the same
// input, 224 px shorter-crop. Inputs: every 10th sample of the real corpus (mostly PNG) and
// its JPEG files alone (where jpeg-source can pass sources through), or a generated corpus.
// The trainer side (Python, one torch thread): CPU ms per sample of decoding a micro-batch
// (record_to_batch + Batch.decoded, the prefetcher's CPU path) and the PSNR of the decoded
// pixels against the exact uint8 pixels of the same rows.
func benchJPEGWire(env *benchEnv) (map[string]float64, error) {
	inputs, err := jpegWireInputs(env)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	var pyArgs []string
	for _, in := range inputs {
		dirs, ms, err := jpegWireRounds(env, in)
		if err != nil {
			return nil, err
		}
		for _, md := range jpegWireModes {
			mode, m := md.key, ms[md.key]
			k := "jpegwire_" + in.label + "_" + mode
			out[k+"_worker_cpu_ms_per_sample"] = 1e3 * m.cpuSeconds / float64(m.rows)
			out[k+"_wire_bytes_per_sample"] = float64(m.bytes) / float64(m.rows)
			line := fmt.Sprintf("   %s corpus, %-12s %d rows: %.2f worker CPU-ms/sample (median of %d rounds), %.1f KB/sample on the wire",
				in.label, mode+":", m.rows, 1e3*m.cpuSeconds/float64(m.rows), jpegWireRoundCount, float64(m.bytes)/float64(m.rows)/1e3)
			if md.dtype == imgproc.DTypeJPEGSource {
				n := m.counts.Source + m.counts.Fallback
				out[k+"_passthrough_fraction"] = float64(m.counts.Source) / float64(max(n, 1))
				line += fmt.Sprintf(", %d of %d images passed through as the source's bytes", m.counts.Source, n)
			}
			fmt.Println(line)
		}
		k := "jpegwire_" + in.label + "_"
		for _, mode := range []string{"uint8", "jpeg", "jpeg_fast", "jpeg_reduce", "jpeg_source"} {
			out[k+mode+"_cpu_vs_float16"] = out[k+mode+"_worker_cpu_ms_per_sample"] / out[k+"float16_worker_cpu_ms_per_sample"]
			out[k+mode+"_bytes_vs_float16"] = out[k+mode+"_wire_bytes_per_sample"] / out[k+"float16_wire_bytes_per_sample"]
		}
		pyArgs = append(pyArgs, in.label, dirs["uint8"], dirs["jpeg"], dirs["jpeg_fast"], dirs["jpeg_reduce"], dirs["jpeg_source"])
	}
	py, err := exec.Command("taskset", append([]string{"-c", "0", env.python, "-c", jpegWireScript}, pyArgs...)...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("python decode: %v\n%s", err, py)
	}
	lines := strings.Split(strings.TrimSpace(string(py)), "\n")
	var res map[string]float64
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		return nil, fmt.Errorf("python decode output: %v\n%s", err, py)
	}
	for k, v := range res {
		out[k] = v
	}
	return out, nil
}

type jpegWireInput struct{ label, path string }

// jpegWireRoundCount is how many times each mode runs on an input, the modes interleaved
// round by round so that a change in the machine's load falls on all of them alike.
const jpegWireRoundCount = 5

// jpegWireRounds runs every mode on in jpegWireRoundCount times and returns, per mode, the
// directory of its payloads (written in the first round) and the run of median CPU time.
func jpegWireRounds(env *benchEnv, in jpegWireInput) (map[string]string, map[string]jpegWireMeasure, error) {
	dirs := map[string]string{}
	runs := map[string][]jpegWireMeasure{}
	for r := range jpegWireRoundCount {
		for _, md := range jpegWireModes {
			dir := ""
			if r == 0 {
				dir = filepath.Join(env.tmp, "jpegwire-"+in.label+"-"+md.key)
				dirs[md.key] = dir
			}
			m, err := jpegWireRun(in.path, md.dtype, md.decode, dir)
			if err != nil {
				return nil, nil, fmt.Errorf("%s %s: %w", in.label, md.key, err)
			}
			runs[md.key] = append(runs[md.key], m)
		}
	}
	med := map[string]jpegWireMeasure{}
	for k, ms := range runs {
		slices.SortFunc(ms, func(a, b jpegWireMeasure) int { return cmp.Compare(a.cpuSeconds, b.cpuSeconds) })
		med[k] = ms[len(ms)/2]
	}
	return dirs, med, nil
}

// jpegWireInputs: the real corpus's every 10th sample and its JPEGs, or a generated corpus.
func jpegWireInputs(env *benchEnv) ([]jpegWireInput, error) {
	if env.corpus == "" {
		p, label, err := benchInput(env, jpegWireSamples)
		return []jpegWireInput{{label, p}}, err
	}
	src := filepath.Join(env.corpus, "dev", "manifest.jsonl")
	every, err := writeSubManifest(src, filepath.Join(env.tmp, "jpegwire-real.jsonl"), func(i int, _ string) bool { return i%10 == 0 })
	if err != nil {
		return nil, err
	}
	jpegs, err := writeSubManifest(src, filepath.Join(env.tmp, "jpegwire-realjpeg.jsonl"), func(_ int, img string) bool {
		f, err := os.Open(img)
		if err != nil {
			return false
		}
		defer f.Close()
		head := make([]byte, 3)
		_, err = io.ReadFull(f, head)
		return err == nil && head[0] == 0xFF && head[1] == 0xD8 && head[2] == 0xFF
	})
	if err != nil {
		return nil, err
	}
	return []jpegWireInput{{"real", every}, {"realjpeg", jpegs}}, nil
}

// writeSubManifest copies the first jpegWireSamples lines of src that keep accepts (line
// number, absolute image path) to dst, with absolute image paths.
func writeSubManifest(src, dst string, keep func(int, string) bool) (string, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer f.Close()
	out, err := os.Create(dst)
	if err != nil {
		return "", err
	}
	defer out.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	n := 0
	for i := 0; sc.Scan() && n < jpegWireSamples; i++ {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		p, _ := l["image"].(string)
		if !filepath.IsAbs(p) {
			p = filepath.Join(filepath.Dir(src), p)
		}
		if !keep(i, p) {
			continue
		}
		l["image"] = p
		b, _ := json.Marshal(l)
		out.Write(append(b, '\n'))
		n++
	}
	return dst, sc.Err()
}

type jpegWireMeasure struct {
	rows       int
	bytes      int64
	cpuSeconds float64
	counts     pipeline.JPEGSourceCounts
}

// jpegWireRun preprocesses input's plan (dp 1, micro-batches of 16) with pixel dtype mode on
// one goroutine, encodes every micro-batch as the service does and writes the payloads to
// dir (one file each, in plan order; none when dir is empty).
func jpegWireRun(input, mode, decode, dir string) (jpegWireMeasure, error) {
	var m jpegWireMeasure
	cfg := pipeline.DefaultConfig()
	cfg.Input, cfg.Workers = input, 1
	cfg.Image.DType, cfg.Image.Decode = mode, decode
	cfg.Loader.AllowAbsolute = true // the subset manifests name the corpus images
	cfg.Plan.DP, cfg.Plan.MicroBatches, cfg.Plan.GlobalBatch = 1, 1, 16
	ctx := context.Background()
	prep, err := pipeline.Prepare(ctx, cfg, io.Discard)
	if err != nil {
		return m, err
	}
	defer prep.Close()
	plan, err := prep.Plan(cfg.Plan.Strategy)
	if err != nil {
		return m, err
	}
	pp, err := pipeline.NewPreprocessor(prep)
	if err != nil {
		return m, err
	}
	mean, std := cfg.Image.MeanStd()
	meta := proto.BatchMeta{Job: "bench", Modality: proto.ModalityAll, Mean: mean, Std: std, Shape: []int{3, cfg.Image.Size, cfg.Image.Size}, PadID: -1}
	meta.DType, meta.Resize = pipeline.PixelEncoding(cfg.Image)
	mem := memory.NewGoAllocator()
	var payloads [][]byte
	c0 := cpuTime()
	err = pp.Run(ctx, plan, func(sb pipeline.StepBatch) error {
		for _, rows := range sb.Rows[0] {
			meta.Step = sb.Step
			rec, err := proto.BuildRecord(mem, meta, rows)
			if err != nil {
				return err
			}
			p, err := proto.EncodeIPC(rec)
			rec.Release()
			if err != nil {
				return err
			}
			payloads = append(payloads, p)
			m.rows += len(rows)
			m.bytes += int64(len(p))
		}
		return nil
	})
	m.cpuSeconds = (cpuTime() - c0).Seconds()
	if err != nil {
		return m, err
	}
	m.counts = pp.JPEGSourceCounts()
	if m.rows == 0 {
		return m, fmt.Errorf("no rows planned from %s", input)
	}
	if dir == "" {
		return m, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return m, err
	}
	for i, p := range payloads {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%06d.arrow", i)), p, 0o644); err != nil {
			return m, err
		}
	}
	return m, nil
}

// jpegWireScript (argv: label, uint8, jpeg, jpeg_fast, jpeg_reduce, jpeg_source dirs, repeated
// per input)
// decodes every payload as the trainer's prefetcher does on the CPU and prints one JSON
// object: decode CPU-ms per sample and PSNR (median, 5th percentile) against uint8.
const jpegWireScript = `
import json, os, sys, time, warnings
import numpy as np, pyarrow as pa, torch
warnings.simplefilter("ignore")
torch.set_num_threads(1)
import torchvision.io  # imported before timing
from mmfeed_trainer.batches import record_to_batch

def batches(d, decode):
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            rb = pa.ipc.open_stream(f.read()).read_next_batch()
        b = record_to_batch(rb)
        yield b.decoded("cpu") if decode else b

out = {}
args = sys.argv[1:]
for j in range(0, len(args), 6):
    label, u8, jp, fast, red, src = args[j:j + 6]
    exact = list(batches(u8, False))
    for mode, d in (("jpeg", jp), ("jpeg_fast", fast), ("jpeg_reduce", red), ("jpeg_source", src)):
        t, n = time.process_time(), 0
        got = []
        for b in batches(d, True):
            got.append(b)
            n += b.size
        out[f"jpegwire_{label}_{mode}_trainer_decode_cpu_ms_per_sample"] = 1e3 * (time.process_time() - t) / n
        psnr = []
        for a, b in zip(exact, got, strict=True):
            assert a.ids == b.ids
            for i in range(a.size):
                if a.weight[i] > 0:
                    x, y = a.pixel_values[i].double(), b.pixel_values[i].double()
                    mse = float(((x - y) ** 2).mean())
                    psnr.append(99.0 if mse == 0 else 10 * np.log10(255.0 ** 2 / mse))
        out[f"jpegwire_{label}_{mode}_psnr_db_median"] = float(np.median(psnr))
        out[f"jpegwire_{label}_{mode}_psnr_db_p05"] = float(np.percentile(psnr, 5))
print(json.dumps(out))
`
