package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"

	"github.com/mmfeed/mmfeed/pipeline/serve"
)

// benchTransport: Arrow batches to 2 consumers on the core data plane (each rank asks for
// a window of batches; send, reassemble, verify, decode, ack) and through the JetStream
// data plane (file store), against raw NATS publish/subscribe of the same byte sizes in
// the same chunk sizes, in the same run (proto's BenchmarkTransport: all pipelined, the
// service's max_payload), for the larger batch.
// The test binary runs with all cores: server, publishers and consumers share them.
func benchTransport(env *benchEnv) (map[string]float64, error) {
	cmd := exec.Command("go", "test", "-run", "^$", "-bench", "^BenchmarkTransport$", "-benchtime", "40x", "./proto/")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("go test -bench: %v\n%s", err, out)
	}
	re := regexp.MustCompile(`BenchmarkTransport/mode=(\w+)/ranks=\d+/rows=(\d+)\S*\s+\d+\s+\d+ ns/op\s+([\d.]+) MB/s`)
	rate := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil && m[2] == "32" {
			rate[m[1]], _ = strconv.ParseFloat(m[3], 64)
		}
	}
	if rate["core"] == 0 || rate["jetstream"] == 0 || rate["raw"] == 0 {
		return nil, fmt.Errorf("no transport rates in:\n%s", out)
	}
	return map[string]float64{
		"transport_core_mb_per_s":         rate["core"],
		"transport_jetstream_mb_per_s":    rate["jetstream"],
		"transport_raw_nats_mb_per_s":     rate["raw"],
		"transport_vs_raw_nats":           rate["core"] / rate["raw"],
		"transport_jetstream_vs_raw_nats": rate["jetstream"] / rate["raw"],
	}, nil
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
	res, err := serve.Throughput(context.Background(), cfg)
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
