package serve

import (
	"context"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/proto"
)

// The types the epoch book records, under the names serve's API has
// (register replies, restore, the report).
type (
	EpochInfo     = epochs.Info
	Segment       = epochs.Segment
	ResizeSegment = epochs.ResizeSegment
)

// planEpoch prepares epoch e for the book (its epochs.PrepareFunc) from the job's
// dataset (opened by the first epoch): replaying stored (or the resize
// decided for it), with the model the next epoch starts with, and records
// its info in the KV bucket.
func (s *Service) planEpoch(ctx context.Context, e int, stored *EpochInfo) (*epochs.Plan, error) {
	stored = s.resizeInfo(e, stored)
	t0 := time.Now()
	ds, err := s.data.get(ctx, s.cfg.Pipeline)
	if err != nil {
		return nil, err
	}
	if err := s.recordJob(ctx); err != nil {
		return nil, err
	}
	ep, err := epochs.Prepare(ctx, s.cfg.epochConfig(), ds, e, stored, s.modelFor(), s.quarantine)
	if err != nil {
		return nil, err
	}
	info := ep.Info()
	s.log.Info("planned epoch", "epoch", e, "steps", info.Steps, "plan_hash", info.PlanHash[:12],
		"quarantined", ep.Prepared().Quarantine.Total(), "seconds", time.Since(t0).Seconds(), "first_window_seconds", ep.FirstWindow().Seconds())
	s.truncWarn.Do(func() { epochs.WarnTruncation(s.log, ep.Prepared()) }) // the captions are the same every epoch
	if err := s.epochs.Record(ctx, e, info); err != nil {
		ep.Close()
		return nil, err
	}
	return ep, nil
}

// epoch returns the plan of epoch e and makes it the one being published:
// recorded as the KV epoch (in the background), shown by the live report;
// plans before e-1 are released (the previous epoch stays for late
// feedback).
func (s *Service) epoch(ctx context.Context, e int) (*epochs.Plan, error) {
	ep, err := s.epochs.Prepared(ctx, e)
	if err != nil {
		return nil, err
	}
	if !s.epochs.Activate(e) {
		return ep, nil
	}
	s.epochs.Background(func() { // informational (restore reads epoch.<e>): off the boundary's path
		if err := s.st.putInt(ctx, proto.KVEpoch, e); err != nil && ctx.Err() == nil {
			s.log.Warn("kv", "err", err)
		}
	})
	s.live.SetEpoch(ep)
	return ep, nil
}

// epochConfig is what preparing an epoch needs of the configuration.
func (c Config) epochConfig() epochs.Config {
	return epochs.Config{Pipeline: c.Pipeline, Job: c.Job, Logger: c.Logger, QuarantineDir: c.QuarantineDir, NoBaselines: c.NoBaselines}
}
