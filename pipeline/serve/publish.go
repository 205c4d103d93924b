package serve

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/proto"
)

// publish sends one payload, retrying transient failures (a lost connection)
// with the same message ids until ctx ends; stream-full backpressure is
// retried inside proto.Publisher.
func (s *Service) publish(ctx context.Context, key proto.BatchKey, gen int, payload []byte) error {
	backoff := 100 * time.Millisecond
	s.health.publishing(true)
	defer s.health.publishing(false)
	start := time.Now()
	for n := 1; ; n++ {
		st, err := s.pub.Publish(ctx, key, gen, payload)
		s.met.retries.Add(float64(st.Retries))
		if err == nil {
			s.met.chunks.Add(float64(st.Chunks))
			s.met.nChunks.Add(int64(st.Chunks))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if permanent(err) {
			return fmt.Errorf("serve: %w", err)
		}
		s.met.retries.Inc()
		escalate(s.log.With("batch", key.String()), "publish failed, retrying", n, time.Since(start), s.cfg.StuckAfter, err)
		if s.cfg.GiveUpAfter > 0 && time.Since(start) > s.cfg.GiveUpAfter {
			return fmt.Errorf("serve: publish %s failing for %s: %w", key, time.Since(start).Round(time.Second), err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func permanent(err error) bool {
	for _, e := range []error{proto.ErrTooLarge, proto.ErrInvalidConfig, proto.ErrInvalidMeta, proto.ErrInvalidRow, proto.ErrInvalidName, proto.ErrSchema} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// requestRewind queues a rewind and stops the current run so the publisher
// applies it at once.
func (s *Service) requestRewind(ctx context.Context, req deliver.Rewind) error {
	return s.publisher.Request(ctx, req)
}

// finishedPublishing reports whether every batch of the job was published.
func (s *Service) finishedPublishing() bool { return s.publisher.Finished() }
