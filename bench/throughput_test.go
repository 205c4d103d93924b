package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/mmfeed/mmfeed/loader/synth/synthtest"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline/serve"
)

// BenchmarkThroughput serves a synthetic corpus end to end (all
// preprocessing, embedded JetStream, in-process consumers) and reports it
// against `mmfeed shard` on the same input.
func BenchmarkThroughput(b *testing.B) {
	input := corpus(b, 400)
	for _, dp := range []int{2, 8} {
		b.Run(fmt.Sprintf("ranks=%d/samples=400", dp), func(b *testing.B) {
			b.ReportAllocs()
			cfg := testConfig(b, input, dp, 1, "colocated")
			cfg.Pipeline.Image.Size = 224
			cfg.Pipeline.Workers = 0
			var res ThroughputResult
			for b.Loop() {
				var err error
				if res, err = Throughput(context.Background(), cfg); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(res.ServeSamplesPerSecond, "serve_samples/s")
			b.ReportMetric(res.ShardSamplesPerSecond, "shard_samples/s")
			b.ReportMetric(res.Ratio, "serve/shard")
			b.ReportMetric(res.TransportShare, "transport_share")
		})
	}
}

// TestThroughputSmoke runs Throughput on a tiny corpus so the bench entry
// point stays working.
func TestThroughputSmoke(t *testing.T) {
	cfg := testConfig(t, corpus(t, 40), 2, 1, "colocated")
	res, err := Throughput(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Samples == 0 || res.ServeSamplesPerSecond <= 0 || res.ShardSamplesPerSecond <= 0 || res.Stats.Batches == 0 {
		t.Errorf("got %+v, want samples, both rates and batches", res)
	}
}

// corpus is synthtest.Corpus: n generated samples, 5% of them bad.
func corpus(t testing.TB, n int) string { return synthtest.Corpus(t, n) }

// testConfig serves input to dp × mp ranks with small images.
func testConfig(t testing.TB, input string, dp, mp int, placement string) serve.Config {
	t.Helper()
	c := serve.DefaultConfig()
	c.Job, c.MP = "job-1", mp
	c.Pipeline.Input = input
	c.Pipeline.Plan.DP, c.Pipeline.Plan.MicroBatches, c.Pipeline.Plan.GlobalBatch = dp, 2, 4*dp
	pl, err := balancer.ParsePlacement(placement)
	if err != nil {
		t.Fatal(err)
	}
	c.Pipeline.Plan.Placement = pl
	c.Pipeline.Image.Size, c.Pipeline.Image.PatchSize = 32, 16
	c.Pipeline.Workers = 2
	c.NATS.DataDir = t.TempDir()
	c.StreamMaxBytes = 64 << 20
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return c
}
