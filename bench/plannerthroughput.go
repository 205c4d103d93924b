package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
)

// PlannerThroughput serves cfg's first epoch with a planner (role planner,
// embedded server listening on a free loopback port, memory stream, no
// HTTP) to dp × mp in-process consumers that acknowledge every batch; once
// the planner is ready it calls startWorkers with the server's URL (the
// caller starts its worker processes there) and stops them at the end. It
// returns the real samples per second from Run until every rank
// acknowledged its last batch, and the service's stats and item times.
func PlannerThroughput(ctx context.Context, cfg serve.Config, startWorkers func(url string) (stop func(), err error)) (float64, serve.Stats, work.Times, error) {
	dir, err := os.MkdirTemp("", "mmfeed-planner-")
	if err != nil {
		return 0, serve.Stats{}, work.Times{}, err
	}
	defer os.RemoveAll(dir)
	cfg.Role, cfg.Epochs, cfg.HTTP, cfg.HTTPToken, cfg.Recalibrate = serve.RolePlanner, 1, "", "", -1
	cfg.NATS = natsenv.Config{Listen: "127.0.0.1:0", DataDir: dir + "/nats", MaxPayload: cfg.NATS.MaxPayload, ReconnectWait: 250 * time.Millisecond}
	cfg.StreamMemory, cfg.QuarantineDir, cfg.WaitForTrainers = true, "", true
	s, err := serve.New(cfg)
	if err != nil {
		return 0, serve.Stats{}, work.Times{}, err
	}
	t0 := time.Now()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- s.Run(rctx) }()
	select {
	case <-s.Ready():
	case err := <-errc:
		return 0, serve.Stats{}, work.Times{}, err
	}
	stop, err := startWorkers(s.ClientURL())
	if err != nil {
		cancel()
		<-errc
		return 0, serve.Stats{}, work.Times{}, fmt.Errorf("serve: start workers: %w", err)
	}
	defer stop()
	var wg sync.WaitGroup
	cerrs := make([]error, ranksOf(cfg))
	for r := range ranksOf(cfg) {
		wg.Go(func() { cerrs[r] = drainRank(rctx, s, cfg, r/cfg.MP, r%cfg.MP) })
	}
	wg.Wait()
	if err := errors.Join(cerrs...); err != nil {
		cancel()
		<-errc
		return 0, serve.Stats{}, work.Times{}, err
	}
	if err := <-errc; err != nil {
		return 0, serve.Stats{}, work.Times{}, err
	}
	st := s.Stats()
	return float64(st.Samples) / time.Since(t0).Seconds(), st, s.WorkTimes(), nil
}
