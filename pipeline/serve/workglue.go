package serve

import (
	"context"
	"fmt"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// The planner role's glue to package work (work.Planner): its setup, the
// feature passes and its item times (the publish loop, package produce,
// turns the epochs into work items and the workers' payloads into the
// ranks' batches). Everything here needs the Service; what the planner
// owns (its slots, counters, cost model and autoscaling observations) is
// read through its methods, never under its lock. Its gauges and counters
// are in workmetrics.go.

// setupWork creates the work queue and the job's work bucket (with the
// preprocessing config and tokenizer), and subscribes to the results.
func (s *Service) setupWork(ctx context.Context) ([]*nats.Subscription, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	wc, tok, err := work.NewConfig(s.cfg.Pipeline)
	if err != nil {
		return nil, err
	}
	if _, err := work.EnsureQueue(ctx, s.js, s.cfg.Replicas, s.cfg.WorkAckWait); err != nil {
		return nil, err
	}
	hash, err := work.EnsureBucket(ctx, s.js, s.cfg.Job, s.cfg.Replicas, wc, tok)
	if err != nil {
		return nil, err
	}
	if s.work, err = work.NewPlanner(s.cfg.Job, s.cfg.MP, s.cfg.WorkAhead, s.js, s.nc, hash, s.log); err != nil {
		return nil, err
	}
	s.work.GuardReplies(s.replies.WorkReplyOK("result"))
	if err := s.registerWork(); err != nil {
		return nil, err
	}
	if err := s.registerScale(); err != nil {
		return nil, fmt.Errorf("serve: metrics: %w", err)
	}
	s.cfg.Pipeline.Features = s.work.Features
	s.log.Info("planner: feature and batch items go to the work queue", "stream", work.Stream, "config", hash,
		"local_workers", s.cfg.LocalWorkers)
	return s.work.Subscribe()
}

// setupFeatureCache makes the job's dataset (every role) read and fill
// the feature cache, and counts it on /metrics. Call it once, before the
// first epoch is prepared.
func (s *Service) setupFeatureCache() error {
	c := work.NewFeatureCache(s.js, s.cfg.Replicas, s.log)
	for result, n := range map[string]func() int64{"hit": c.Hits, "miss": c.Misses} {
		if err := s.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mmfeed_serve_feature_cache_total",
			Help: "Feature passes read from the feature cache (hit) and computed (miss), by dataset fingerprint.", ConstLabels: prometheus.Labels{"result": result}},
			func() float64 { return float64(n()) })); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	s.cfg.Pipeline.FeatureCache = c
	return nil
}

// featureCache is the service's feature cache (nil before
// setupFeatureCache).
func (s *Service) featureCache() *work.FeatureCache {
	c, _ := s.cfg.Pipeline.FeatureCache.(*work.FeatureCache)
	return c
}

// WorkTimes returns the planner's predicted against measured item times
// over the job so far (zero with role all).
func (s *Service) WorkTimes() work.Times {
	if s.work == nil {
		return work.Times{}
	}
	return s.work.Times()
}
