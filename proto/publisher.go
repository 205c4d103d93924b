package proto

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mmfeed/mmfeed/internal/ctxutil"
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// ChunkSize is the data bytes per message; 0 derives it from the
	// server's max_payload (ChunkSize(nc.MaxPayload())).
	ChunkSize int
	// Window is how many chunks are in flight (published, not yet acked)
	// at once.
	Window int
	// RetryMin and RetryMax bound the exponential backoff between attempts
	// after a stream-full rejection or a lost ack.
	RetryMin, RetryMax time.Duration
	// AckTimeout bounds the wait for one chunk's ack before it is resent
	// (resending is safe: Nats-Msg-Id dedupes it).
	AckTimeout time.Duration
}

// DefaultPublisherConfig returns a derived chunk size, 16 chunks in flight,
// 5 ms..500 ms backoff, a 30 s ack timeout.
func DefaultPublisherConfig() PublisherConfig {
	return PublisherConfig{Window: 16, RetryMin: 5 * time.Millisecond, RetryMax: 500 * time.Millisecond, AckTimeout: 30 * time.Second}
}

// Validate checks the fields.
func (c PublisherConfig) Validate() error {
	if c.ChunkSize < 0 || c.Window < 1 || c.RetryMin <= 0 || c.RetryMax < c.RetryMin || c.AckTimeout <= 0 {
		return fmt.Errorf("proto: publisher config %+v: %w", c, ErrInvalidConfig)
	}
	return nil
}

// Publisher publishes batches as chunk messages to JetStream. Safe for
// concurrent use; each Publish call sends one batch.
type Publisher struct {
	js        jetstream.JetStream
	cfg       PublisherConfig
	chunkSize int
	limits    sync.Map // stream name → int64 MaxBytes, looked up on first rejection
}

// PublishStats reports one Publish.
type PublishStats struct {
	Chunks     int
	Bytes      int
	Retries    int // chunk publishes repeated after a rejection or timeout
	Duplicates int // chunks the stream already had (same Nats-Msg-Id)
}

// NewPublisher returns a Publisher on nc's JetStream context js.
func NewPublisher(nc *nats.Conn, js jetstream.JetStream, cfg PublisherConfig) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cs := cfg.ChunkSize
	if cs == 0 {
		var err error
		if cs, err = ChunkSize(nc.MaxPayload()); err != nil {
			return nil, err
		}
	} else if int64(cs)+HeaderBudget > nc.MaxPayload() {
		return nil, fmt.Errorf("proto: chunk size %d + %d header bytes > server max_payload %d: %w", cs, HeaderBudget, nc.MaxPayload(), ErrInvalidConfig)
	}
	return &Publisher{js: js, cfg: cfg, chunkSize: cs}, nil
}

// ChunkSize returns the data bytes per message this Publisher uses.
func (p *Publisher) ChunkSize() int { return p.chunkSize }

// PublishRecord encodes rec (built for meta) and publishes it.
func (p *Publisher) PublishRecord(ctx context.Context, meta BatchMeta, gen int, rec arrow.RecordBatch) (PublishStats, error) {
	payload, err := EncodeIPC(rec)
	if err != nil {
		return PublishStats{}, err
	}
	return p.Publish(ctx, meta.Key(), gen, payload)
}

// Publish sends payload as the chunks of batch key (replay generation gen)
// and returns when the stream has acknowledged every chunk. A full stream
// (DiscardNew at MaxBytes) or a lost ack makes it back off and resend the
// unacknowledged chunks until ctx ends; any other rejection is returned.
func (p *Publisher) Publish(ctx context.Context, key BatchKey, gen int, payload []byte) (PublishStats, error) {
	msgs, err := Chunk(key, gen, payload, p.chunkSize)
	if err != nil {
		return PublishStats{}, err
	}
	st := PublishStats{Chunks: len(msgs), Bytes: len(payload)}
	todo := msgs
	backoff := p.cfg.RetryMin
	for len(todo) > 0 {
		failed, err := p.sendAll(ctx, todo, &st)
		if err != nil {
			return st, fmt.Errorf("proto: publish %v: %w", key, err)
		}
		if len(failed) == 0 {
			break
		}
		if st.Retries == 0 {
			if err := p.checkFits(ctx, key.Job, len(payload), len(msgs)); err != nil {
				return st, fmt.Errorf("proto: publish %v: %w", key, err)
			}
		}
		st.Retries += len(failed)
		todo = failed
		if err := ctxutil.Sleep(ctx, backoff); err != nil {
			return st, fmt.Errorf("proto: publish %v: %d of %d chunks unacknowledged: %w", key, len(todo), len(msgs), err)
		}
		backoff = min(2*backoff, p.cfg.RetryMax)
	}
	return st, nil
}

// msgOverhead approximates what a stored chunk costs beyond its data
// (subject, headers, store record).
const msgOverhead = 1024

// checkFits fails with ErrTooLarge when the whole batch can never be in the
// stream at once: the consumer acknowledges a batch only when it has every
// chunk, so waiting for space would never end.
func (p *Publisher) checkFits(ctx context.Context, job string, size, chunks int) error {
	name := StreamName(job)
	v, ok := p.limits.Load(name)
	if !ok {
		s, err := p.js.Stream(ctx, name)
		if err != nil {
			return nil // unknown for now (no stream yet, leader election): keep retrying
		}
		v = s.CachedInfo().Config.MaxBytes
		p.limits.Store(name, v)
	}
	if lim := v.(int64); lim > 0 && int64(size)+int64(chunks)*msgOverhead > lim {
		return fmt.Errorf("batch of %d bytes in %d chunks cannot fit stream %s max_bytes %d: %w", size, chunks, name, lim, ErrTooLarge)
	}
	return nil
}

// sendAll publishes msgs Window at a time and returns the ones to retry.
func (p *Publisher) sendAll(ctx context.Context, msgs []*nats.Msg, st *PublishStats) ([]*nats.Msg, error) {
	var failed []*nats.Msg
	for start := 0; start < len(msgs); start += p.cfg.Window {
		win := msgs[start:min(start+p.cfg.Window, len(msgs))]
		futs := make([]jetstream.PubAckFuture, len(win))
		for i, m := range win {
			f, err := p.js.PublishMsgAsync(m)
			if err != nil {
				if !retryable(err) {
					return nil, err
				}
				failed = append(failed, m)
				continue
			}
			futs[i] = f
		}
		for i, f := range futs {
			if f == nil {
				continue
			}
			retry, err := p.await(ctx, f, st)
			if err != nil {
				p.settle(futs[i:])
				return nil, err
			}
			if retry {
				failed = append(failed, win[i])
			}
		}
	}
	return failed, nil
}

func (p *Publisher) await(ctx context.Context, f jetstream.PubAckFuture, st *PublishStats) (retry bool, err error) {
	t := time.NewTimer(p.cfg.AckTimeout)
	defer t.Stop()
	select {
	case ack := <-f.Ok():
		if ack.Duplicate {
			st.Duplicates++
		}
		return false, nil
	case err := <-f.Err():
		if retryable(err) {
			return true, nil
		}
		return false, err
	case <-t.C:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// settle waits (at most AckTimeout in all) until the stream has stored or
// refused each chunk already sent, so that a canceled Publish leaves nothing
// in flight: a caller that purges the subject next (a rewind) cannot have a
// chunk of the old batch land after the purge.
func (p *Publisher) settle(futs []jetstream.PubAckFuture) {
	t := time.NewTimer(p.cfg.AckTimeout)
	defer t.Stop()
	for _, f := range futs {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case <-f.Err():
		case <-t.C:
			return
		}
	}
}

// JetStream error codes that clear up by themselves.
const (
	errCodeStreamFull      = 10077 // "maximum bytes/messages exceeded" (DiscardNew)
	errCodeTooManyRequests = 10167 // the stream's inbound queue is full (128 MiB in nats-server 2.1x)
)

// retryable reports rejections that clear up by themselves: a full stream,
// a full inbound queue of the stream (many large chunks in flight from
// concurrent Publish calls), no stream responder yet, a lost or late ack, a
// stalled async publisher.
func retryable(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == errCodeStreamFull || apiErr.ErrorCode == errCodeTooManyRequests) {
		return true
	}
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrAsyncPublishTimeout) ||
		errors.Is(err, jetstream.ErrTooManyStalledMsgs)
}
