package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"

	"github.com/mmfeed/mmfeed/pipeline/serve"
)

// benchTransport: Arrow batches to 2 consumers on the core data plane (each rank asks for
// a window of batches; send, reassemble, verify, decode, ack) and through the JetStream
// data plane (file store), against raw NATS publish/subscribe of the same encoded batches
// in the same chunk sizes (proto's BenchmarkTransport: all pipelined, the service's
// max_payload), for the larger batch. The test binary is built once and each mode runs in
// its own process, once untimed and then transportRounds rounds interleaved (order reversed every other round),
// so every mode sees the same load; the ratios are the median (and min) of the per-round
// ratios, the rates the per-mode medians.
// The test binary runs with all cores: server, publishers and consumers share them.
func benchTransport(env *benchEnv) (map[string]float64, error) {
	bin := filepath.Join(env.tmp, "proto.test")
	if out, err := exec.Command("go", "test", "-c", "-o", bin, "./proto/").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go test -c: %v\n%s", err, out)
	}
	var sides []benchSide
	for _, mode := range []string{"core", "jetstream", "raw"} {
		sides = append(sides, benchSide{mode, func() (float64, error) { return transportRate(bin, mode) }})
	}
	// One untimed pass of each mode first: the first process after the link (its binary
	// still being written back, the page cache and the CPU's clock not yet settled) ran
	// 0.66-0.79x in three of four quiet runs whose other rounds were mostly 0.8-1.0x.
	for _, s := range sides {
		if _, err := s.pass(); err != nil {
			return nil, fmt.Errorf("%s (warm-up): %w", s.name, err)
		}
	}
	rates, err := interleave(sides, transportRounds)
	if err != nil {
		return nil, err
	}
	core := ratiosOf(rates, "transport_vs_raw_nats", "core", "raw")
	js := ratiosOf(rates, "transport_jetstream_vs_raw_nats", "jetstream", "raw")
	return map[string]float64{
		"transport_core_mb_per_s":         median(rates["core"]),
		"transport_jetstream_mb_per_s":    median(rates["jetstream"]),
		"transport_raw_nats_mb_per_s":     median(rates["raw"]),
		"transport_vs_raw_nats":           median(core),
		"transport_vs_raw_nats_median":    median(core),
		"transport_vs_raw_nats_min":       slices.Min(core),
		"transport_jetstream_vs_raw_nats": median(js),
	}, nil
}

// transportRounds is how often benchTransport runs each mode (about 10 s a round).
const transportRounds = 5

// transportRate runs one mode of BenchmarkTransport (2 ranks, 32 rows, 40 batches a rank)
// in the test binary bin and returns its MB/s.
func transportRate(bin, mode string) (float64, error) {
	cmd := exec.Command(bin, "-test.run", "^$", "-test.bench", "^BenchmarkTransport$/^mode="+mode+"$/^ranks=2$/^rows=32$", "-test.benchtime", "40x")
	cmd.Dir = "proto"
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%s: %v\n%s", mode, err, out)
	}
	return parseTransportRate(out, mode)
}

var transportLine = regexp.MustCompile(`BenchmarkTransport/mode=([\w-]+)/ranks=\d+/rows=(\d+)\S*\s+\d+\s+\d+ ns/op\s+([\d.]+) MB/s`)

// parseTransportRate returns the MB/s of mode's rows=32 line in go test -bench output.
func parseTransportRate(out []byte, mode string) (float64, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := transportLine.FindStringSubmatch(sc.Text()); m != nil && m[1] == mode && m[2] == "32" {
			return strconv.ParseFloat(m[3], 64)
		}
	}
	return 0, fmt.Errorf("no transport rate for mode=%s in:\n%s", mode, out)
}

// benchServe: samples per second delivered by `serve` (preprocessing, Arrow, the embedded
// server's core data plane, 2 in-process consumers fetching and acknowledging, all on the
// one core the bench allows) against `shard` (preprocessing, Arrow files) on
// the same input, and the transport's share of the preprocessing CPU time. serve_vs_shard_cpu
// is the same comparison in process CPU seconds (shard's over serve's, same run): the one
// to read on a loaded machine, where other jobs take the wall-clock time.
func benchServe(env *benchEnv) (map[string]float64, error) {
	input, label, err := benchInput(env, 800)
	if err != nil {
		return nil, err
	}
	cfg := serve.DefaultConfig()
	cfg.Job = "bench"
	cfg.Pipeline.Input = input
	cfg.Pipeline.Plan.DP, cfg.Pipeline.Plan.GlobalBatch = 2, 32
	res, err := Throughput(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	fmt.Printf("   %s corpus, %d samples: shard %.0f samples/s (%.1f s, %.1f CPU-s), serve %.0f samples/s (%.1f s, %.1f CPU-s)\n", label, res.Samples,
		res.ShardSamplesPerSecond, res.ShardSeconds, res.ShardCPUSeconds, res.ServeSamplesPerSecond, res.ServeSeconds, res.ServeCPUSeconds)
	return map[string]float64{
		"serve_samples_per_s":       res.ServeSamplesPerSecond,
		"shard_samples_per_s":       res.ShardSamplesPerSecond,
		"serve_vs_shard":            res.Ratio,
		"serve_vs_shard_cpu":        res.ShardCPUSeconds / res.ServeCPUSeconds,
		"serve_transport_cpu_share": res.TransportShare,
	}, nil
}
