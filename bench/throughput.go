package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ThroughputResult compares end-to-end serving with `mmfeed shard` on the same
// input and configuration, for bench/ (make bench).
type ThroughputResult struct {
	// Samples is the real samples of the epoch.
	Samples int `json:"samples"`
	// ShardSeconds and ShardCPUSeconds: pipeline.WriteShards wall and process
	// CPU time (preprocessing plus Arrow file writes).
	ShardSeconds    float64 `json:"shard_seconds"`
	ShardCPUSeconds float64 `json:"shard_cpu_seconds"`
	// ServeSeconds and ServeCPUSeconds: from Run until every rank acknowledged
	// its last batch (embedded server and in-process consumers included).
	ServeSeconds    float64 `json:"serve_seconds"`
	ServeCPUSeconds float64 `json:"serve_cpu_seconds"`
	// ShardSamplesPerSecond and ServeSamplesPerSecond; Ratio is serve/shard.
	ShardSamplesPerSecond float64 `json:"shard_samples_per_second"`
	ServeSamplesPerSecond float64 `json:"serve_samples_per_second"`
	Ratio                 float64 `json:"ratio"`
	// TransportShare is (build + encode + publish seconds) over the shard
	// run's CPU seconds: the transport's cost relative to preprocessing
	// (publish time includes waiting for JetStream acks, so it is an upper
	// bound).
	TransportShare float64     `json:"transport_share"`
	Stats          serve.Stats `json:"stats"`
}

// Throughput prepares cfg's first epoch, writes it with pipeline.WriteShards
// into a temporary folder, then serves it with the embedded server (in-process
// connections only, memory stream, no HTTP) to dp × mp in-process consumers
// that acknowledge every batch, and reports both rates. In a CPU profile the
// two phases' samples carry the label phase=shard or phase=serve.
func Throughput(ctx context.Context, cfg serve.Config) (ThroughputResult, error) {
	var res ThroughputResult
	dir, err := os.MkdirTemp("", "mmfeed-throughput-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	cpu0, t0 := cpuSeconds(), time.Now()
	pprof.Do(ctx, pprof.Labels("phase", "shard"), func(ctx context.Context) { // goroutines started here inherit it
		var prep *pipeline.Prepared
		if prep, err = pipeline.Prepare(ctx, cfg.Pipeline, nil); err != nil {
			return
		}
		plan, perr := prep.Plan(cfg.Pipeline.Plan.Strategy)
		if err = perr; err == nil {
			_, err = pipeline.WriteShards(ctx, prep, plan, dir+"/shards", nil)
		}
		prep.Close()
	})
	if err != nil {
		return res, err
	}
	res.ShardSeconds, res.ShardCPUSeconds = time.Since(t0).Seconds(), cpuSeconds()-cpu0
	defer pprof.SetGoroutineLabels(ctx)
	ctx = pprof.WithLabels(ctx, pprof.Labels("phase", "serve"))
	pprof.SetGoroutineLabels(ctx) // the service's and the consumers' goroutines inherit it

	cfg.Epochs, cfg.HTTP, cfg.HTTPToken, cfg.Recalibrate = 1, "", "", -1
	cfg.NATS = natsenv.Config{DataDir: dir + "/nats", MaxPayload: cfg.NATS.MaxPayload, ReconnectWait: 250 * time.Millisecond}
	cfg.StreamMemory, cfg.QuarantineDir, cfg.WaitForTrainers = true, "", true
	s, err := serve.New(cfg)
	if err != nil {
		return res, err
	}
	cpu0, t0 = cpuSeconds(), time.Now()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- s.Run(rctx) }()
	select {
	case <-s.Ready():
	case err := <-errc:
		return res, err
	}
	var wg sync.WaitGroup
	cerrs := make([]error, ranksOf(cfg))
	for r := range ranksOf(cfg) {
		wg.Go(func() { cerrs[r] = drainRank(rctx, s, cfg, r/cfg.MP, r%cfg.MP) })
	}
	wg.Wait()
	if err := errors.Join(cerrs...); err != nil {
		cancel()
		<-errc
		return res, err
	}
	if err := <-errc; err != nil {
		return res, err
	}
	res.ServeSeconds, res.ServeCPUSeconds = time.Since(t0).Seconds(), cpuSeconds()-cpu0
	res.Stats = s.Stats()
	res.Samples = int(res.Stats.Samples)
	res.ShardSamplesPerSecond = float64(res.Samples) / res.ShardSeconds
	res.ServeSamplesPerSecond = float64(res.Samples) / res.ServeSeconds
	res.Ratio = res.ServeSamplesPerSecond / res.ShardSamplesPerSecond
	if res.ShardCPUSeconds > 0 {
		res.TransportShare = (res.Stats.BuildSeconds + res.Stats.EncodeSeconds + res.Stats.PublishSeconds) / res.ShardCPUSeconds
	}
	return res, nil
}

// drainRank is a minimal trainer rank: register, take every batch of the
// epoch, acknowledge it, report done.
func drainRank(ctx context.Context, s *serve.Service, cfg serve.Config, dp, mp int) error {
	nc, err := s.DialInProcess()
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := proto.Register{Job: cfg.Job, DPRank: dp, MPRank: mp, DP: cfg.Pipeline.Plan.DP, MP: cfg.MP,
		Placement: cfg.Pipeline.Plan.Placement.String(), Epoch: cfg.Pipeline.Plan.Epoch}
	b, err := proto.EncodeControl(reg)
	if err != nil {
		return err
	}
	subj, _ := proto.ControlSubject(cfg.Job, proto.CtlRegister)
	msg, err := nc.RequestWithContext(ctx, subj, b)
	if err != nil {
		return err
	}
	var rep proto.RegisterReply
	if err := proto.DecodeControl(msg.Data, &rep); err != nil {
		return err
	}
	if !rep.OK {
		return fmt.Errorf("serve: throughput rank %d.%d refused: %s", dp, mp, rep.Error)
	}
	cons, err := rankReader(ctx, nc, cfg, rep, dp, mp)
	if err != nil {
		return err
	}
	defer cons.Close()
	for range rep.Steps * rep.MicroBatches {
		bt, err := cons.Next(ctx)
		if err != nil {
			return err
		}
		bt.Release()
		if err := bt.Ack(ctx); err != nil {
			return err
		}
	}
	done, _ := proto.EncodeControl(proto.Done{Job: cfg.Job, Epoch: rep.Epoch, DPRank: dp, MPRank: mp, Steps: rep.Steps})
	dsubj, _ := proto.ControlSubject(cfg.Job, proto.CtlDone)
	if err := nc.Publish(dsubj, done); err != nil {
		return err
	}
	return nc.Flush()
}

// rankReader returns a rank's reader on the service's data plane.
func rankReader(ctx context.Context, nc *nats.Conn, cfg serve.Config, rep proto.RegisterReply, dp, mp int) (interface {
	Next(context.Context) (*proto.Batch, error)
	Close()
}, error) {
	if rep.DataPlane == proto.DataPlaneCore {
		f, err := proto.NewFetcher(nc, memory.NewGoAllocator(), proto.DefaultFetcherConfig(cfg.Job, dp, mp))
		if err != nil {
			return nil, err
		}
		f.AddEpoch(rep.Epoch, rep.Steps, rep.MicroBatches)
		f.Start(rep.Epoch, 0)
		return f, nil
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	cc := proto.DefaultConsumerConfig(cfg.Job, dp, mp)
	cc.MaxAckPending, cc.AckWait = cfg.MaxAckPending, cfg.AckWait
	return proto.NewConsumer(ctx, js, memory.NewGoAllocator(), cc)
}

// cpuSeconds is the process's user + system CPU time.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// ranksOf is the dp × mp trainer ranks of cfg.
func ranksOf(cfg serve.Config) int { return cfg.Pipeline.Plan.DP * cfg.MP }
