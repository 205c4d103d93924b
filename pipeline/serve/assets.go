package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"strings"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go/jetstream"
)

// health is what /healthz reports beyond the NATS connection: whether the
// job's JetStream assets were reachable at the last check, whether the last
// write of the job's state succeeded, and since when a publish has been in
// flight. It owns its lock.
type health struct {
	mu       sync.Mutex
	assets   streak    // asset checks (checked)
	state    streak    // writes of the job's state (wrote)
	pubSince time.Time // start of the publish in flight; zero: none
}

// streak is a run of failures in a row: the last one, and when the first
// happened. The zero value is no failure.
type streak struct {
	err   error
	since time.Time
	n     int
}

// add records one outcome and returns the failures in a row (0 after a
// success) and how long they have lasted.
func (s *streak) add(err error, now time.Time) (int, time.Duration) {
	if err == nil {
		*s = streak{}
		return 0, 0
	}
	if s.n == 0 {
		s.since = now
	}
	s.err = err
	s.n++
	return s.n, now.Sub(s.since)
}

// checked records one asset check and returns the failures in a row and
// how long they have lasted.
func (h *health) checked(err error, now time.Time) (int, time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.assets.add(err, now)
}

// wrote records one write of the job's state and returns the failures in a
// row (0 after a success) and how long they have lasted.
func (h *health) wrote(err error, now time.Time) (int, time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state.add(err, now)
}

// stateFailure returns the last state write's failure (nil: it
// succeeded) and how long the failures have lasted.
func (h *health) stateFailure(now time.Time) (error, time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state.err == nil {
		return nil, 0
	}
	return h.state.err, now.Sub(h.state.since)
}

// publishing marks the start (on) or the end of a publish.
func (h *health) publishing(on bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pubSince = time.Time{}
	if on {
		h.pubSince = time.Now()
	}
}

// publishFor returns how long the publish in flight has lasted (0: none).
func (h *health) publishFor(now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pubSince.IsZero() {
		return 0
	}
	return now.Sub(h.pubSince)
}

// problems returns why the service is unhealthy ("" when healthy): assets
// unreachable, the job's state not writable (a full disk), or one publish in flight for longer than stuck while the
// stream has room (a full stream is the trainers' backpressure, not a
// fault).
func (h *health) problems(now time.Time, stuck time.Duration, streamHasRoom bool) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var why []string
	if h.assets.err != nil {
		why = append(why, fmt.Sprintf("jetstream assets unreachable for %s: %v", now.Sub(h.assets.since).Round(time.Second), h.assets.err))
	}
	if h.state.err != nil {
		why = append(why, fmt.Sprintf("job state writes failing for %s: %v", now.Sub(h.state.since).Round(time.Second), h.state.err))
	}
	if !h.pubSince.IsZero() && now.Sub(h.pubSince) > stuck && streamHasRoom {
		why = append(why, fmt.Sprintf("a publish stuck for %s", now.Sub(h.pubSince).Round(time.Second)))
	}
	return strings.Join(why, "; ")
}

// escalate logs the n-th failure in a row of what: at the 1st, 2nd, 4th,
// 8th, ... (a log with backoff), as a warning until it has lasted for
// longer than stuck, then as an error.
func escalate(log *slog.Logger, what string, n int, lasted, stuck time.Duration, err error) {
	if bits.OnesCount(uint(n)) != 1 {
		return
	}
	level := slog.LevelWarn
	if lasted > stuck {
		level = slog.LevelError
	}
	log.Log(context.Background(), level, what, "failures", n, "for", lasted.Round(time.Millisecond), "err", err)
}

// storageCause is natsenv.StorageCause for the service's embedded server
// (none with an external deployment) and its data directory.
func (s *Service) storageCause(err error) error {
	return natsenv.StorageCause(s.ns, s.cfg.NATS.DataDir, err)
}

// stored records a state write's outcome for /healthz and the log (the
// first failure of a streak and every power of two after it), and returns
// err with its storage cause named.
func (s *Service) stored(err error) error {
	if natsenv.IsKeyAnswer(err) {
		return err // an answer about the key, not a failed write
	}
	err = s.storageCause(err)
	if n, lasted := s.health.wrote(err, time.Now()); n > 0 {
		s.met.stateWriteFailures.Inc()
		escalate(s.log, "job state write failed", n, lasted, s.cfg.StuckAfter, err)
	}
	return err
}

// watchAssets checks the job's JetStream assets every AssetCheck: the KV
// bucket, the quarantine bucket, the lease bucket and, on the JetStream data plane, the
// stream and every rank's consumer. A lost asset is recreated (and its
// state rewritten from memory; a lost stream rewinds every rank to its
// first unacknowledged step, so no batch is lost). A check that fails is
// logged with backoff, counted, reported by /healthz, and after GiveUpAfter
// of failures in a row ends the service with an error.
func (s *Service) watchAssets(ctx context.Context) error {
	if s.cfg.AssetCheck <= 0 {
		return nil
	}
	t := time.NewTicker(s.cfg.AssetCheck)
	defer t.Stop()
	stuck := 0 // checks in a row that found a publish stuck
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, min(max(2*s.cfg.AssetCheck, 500*time.Millisecond), 5*time.Second))
		err := s.storageCause(s.checkAssets(cctx))
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err := s.watchPublish(&stuck); err != nil {
			return err
		}
		if err := s.watchState(); err != nil {
			return err
		}
		n, lasted := s.health.checked(err, time.Now())
		if err == nil {
			continue
		}
		s.met.assetFailures.Inc()
		escalate(s.log, "jetstream assets unreachable", n, lasted, s.cfg.StuckAfter, err)
		if s.cfg.GiveUpAfter > 0 && lasted > s.cfg.GiveUpAfter {
			return fmt.Errorf("serve: jetstream assets unreachable for %s: %w", lasted.Round(time.Second), err)
		}
	}
}

// watchState ends the service once writes of the job's state have failed
// for longer than GiveUpAfter, with the last failure's cause (a full disk:
// ErrStorageFull).
func (s *Service) watchState() error {
	err, d := s.health.stateFailure(time.Now())
	if err != nil && s.cfg.GiveUpAfter > 0 && d > s.cfg.GiveUpAfter {
		return fmt.Errorf("serve: job state not writable for %s: %w", d.Round(time.Second), err)
	}
	return nil
}

// errPublishStuck: one publish has been in flight for longer than
// StuckAfter while the stream had room (a retry loop inside the publisher
// that does not clear: no stream responder, lost acks).
var errPublishStuck = errors.New("a publish is stuck while the stream has room")

// watchPublish escalates a stuck publish like an unreachable asset: logged
// with backoff, a warning and then an error, and after GiveUpAfter the
// service's end. n counts the checks in a row that found it stuck.
func (s *Service) watchPublish(n *int) error {
	d := s.health.publishFor(time.Now())
	if d <= s.cfg.StuckAfter || !s.streamHasRoom() {
		*n = 0
		return nil
	}
	*n++
	escalate(s.log, "publish stuck", *n, d, 2*s.cfg.StuckAfter, errPublishStuck)
	if s.cfg.GiveUpAfter > 0 && d > s.cfg.GiveUpAfter {
		return fmt.Errorf("serve: publish in flight for %s: %w", d.Round(time.Second), errPublishStuck)
	}
	return nil
}

// streamHasRoom reports whether the stream holds less than half its bound
// (true on the core data plane or before the first poll): a publish that
// waits on a fuller stream is backpressure, not a fault.
func (s *Service) streamHasRoom() bool {
	if g := s.plane.Gauges(); g.Stream != nil {
		return g.Stream.Bytes < uint64(s.cfg.StreamMaxBytes)/2
	}
	return true
}

// checkAssets recreates what is missing; it fails when an asset cannot be
// read or recreated.
func (s *Service) checkAssets(ctx context.Context) error {
	c := s.cfg
	if _, err := s.js.KeyValue(ctx, proto.BucketName(c.Job)); errors.Is(err, jetstream.ErrBucketNotFound) {
		if err := s.recreate("kv bucket "+proto.BucketName(c.Job), func() error { return s.recreateState(ctx) }); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("kv bucket: %w", err)
	}
	if _, err := s.js.KeyValue(ctx, QuarantineBucket(c.Job)); errors.Is(err, jetstream.ErrBucketNotFound) {
		if err := s.recreate("quarantine bucket", func() error {
			if _, err := c.assets().EnsureQuarantine(ctx, s.js); err != nil {
				return fmt.Errorf("recreate quarantine bucket: %w", err)
			}
			return nil
		}); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("quarantine bucket: %w", err)
	}
	if _, err := s.js.KeyValue(ctx, natsenv.LeaseBucket(c.Job)); errors.Is(err, jetstream.ErrBucketNotFound) {
		// Empty: the lease's next renewal finds its key gone and creates it
		// again (natsenv.Lease's reclaim).
		if err := s.recreate("lease bucket "+natsenv.LeaseBucket(c.Job), func() error {
			if _, err := c.assets().EnsureLease(ctx, s.js); err != nil {
				return fmt.Errorf("recreate lease bucket: %w", err)
			}
			return nil
		}); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("lease bucket: %w", err)
	}
	return s.plane.CheckAssets(ctx)
}

// assets are the job's JetStream assets as c declares them.
func (c Config) assets() natsenv.Assets {
	return natsenv.Assets{Job: c.Job, Memory: c.StreamMemory, Replicas: c.Replicas, LeaseTTL: c.LeaseTTL,
		StreamMaxBytes: c.StreamMaxBytes, Duplicates: c.Duplicates, MaxAckPending: c.MaxAckPending, AckWait: c.AckWait}
}

// recreate logs that asset is lost, runs do to recreate it, and counts the
// recreation (assets_recreated_total) once do succeeded: a count says the
// asset is back, not only that it went missing.
func (s *Service) recreate(asset string, do func() error) error {
	s.log.Error("jetstream asset lost: recreating it", "asset", asset)
	if err := do(); err != nil {
		return err
	}
	s.met.assetsRecreated.WithLabelValues(strings.Fields(asset)[0]).Inc()
	return nil
}

// recreateState recreates the job's KV bucket and writes back what the
// service holds: the job record, the planned epochs, each rank's
// generation, acknowledged step and handed step.
func (s *Service) recreateState(ctx context.Context) error {
	if _, err := s.cfg.assets().EnsureState(ctx, s.js); err != nil {
		return fmt.Errorf("recreate kv bucket: %w", err)
	}
	if err := s.checkJob(ctx); err != nil {
		return err
	}
	if err := s.epochs.RecordAll(ctx); err != nil {
		return err
	}
	return s.ranks.Rewrite(ctx)
}
