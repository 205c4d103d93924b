package proto

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/nats-io/nats.go/jetstream"
)

// Batch is one reassembled, verified and decoded micro-batch.
type Batch struct {
	Header ChunkHeader // batch key, generation, size, checksum (Index 0)
	Meta   BatchMeta   // from the record's schema; Step, MicroBatch from the header
	// Record is owned by the Batch; Release releases it. On the core data
	// plane the Fetcher reuses a multi-chunk batch's memory for a later
	// batch once every reference to the record is released (arrow's
	// reference counting: Retain keeps it): values read from it without a
	// copy (String.Value, buffer bytes) are valid until then. ReadRows
	// copies.
	Record arrow.RecordBatch

	c     *Consumer // JetStream data plane
	fetch *Fetcher  // core data plane
	mu    sync.Mutex
	msgs  []jetstream.Msg
	acked bool
}

// Release releases the record. It does not acknowledge the batch.
func (b *Batch) Release() {
	if b.Record != nil {
		b.Record.Release()
		b.Record = nil
	}
}

// Ack acknowledges every chunk of the batch (and any redelivered copies the
// Consumer has seen since), waiting for the server to confirm the last one.
// Acknowledged chunks are removed from the stream (work-queue retention); on
// the core data plane the service drops the batches up to this one, and Ack
// waits for its answer, sending the ack again until one comes or ctx ends.
// Ack the batch once its step has been applied, not before: unacked batches
// are redelivered after AckWait or a restart.
func (b *Batch) Ack(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.acked {
		return nil
	}
	if b.fetch != nil {
		if err := b.fetch.ack(ctx, b.Header.BatchKey); err != nil {
			return err
		}
		b.acked = true
		return nil
	}
	for i, m := range b.msgs {
		var err error
		if i == len(b.msgs)-1 {
			err = m.DoubleAck(ctx)
		} else {
			err = m.Ack()
		}
		if err != nil {
			return fmt.Errorf("proto: ack %v chunk %d: %w", b.Header.BatchKey, i, err)
		}
	}
	b.acked = true
	b.c.forget(b.Header.BatchKey)
	return nil
}

// InProgress resets the server's AckWait timer of every chunk, for a caller
// that holds the batch longer than AckWait (nothing to do on the core data
// plane, where the service holds a batch until it is acknowledged).
func (b *Batch) InProgress() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.msgs {
		if err := m.InProgress(); err != nil {
			return fmt.Errorf("proto: in progress %v: %w", b.Header.BatchKey, err)
		}
	}
	return nil
}

// addRedelivery attaches a redelivered chunk: acked at once if the batch was
// already acknowledged, otherwise with the batch.
func (b *Batch) addRedelivery(m jetstream.Msg) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.acked {
		_ = m.Ack()
		return
	}
	b.msgs = append(b.msgs, m)
}

// BatchError is the error Next returns for a batch that could not be
// reassembled or decoded; its chunks were terminated (not redelivered), so
// the trainer asks for a Resend with Key.
type BatchError struct {
	Key BatchKey
	Gen int
	Err error
}

func (e *BatchError) Error() string {
	return fmt.Sprintf("proto: batch %v gen %d: %v", e.Key, e.Gen, e.Err)
}
func (e *BatchError) Unwrap() error { return e.Err }

// Consumer reads one rank's batches from its durable pull consumer. Next is
// not safe for concurrent use; Batch.Ack may run on another goroutine.
type Consumer struct {
	cfg  ConsumerConfig
	mem  memory.Allocator
	it   jetstream.MessagesContext
	re   *Reassembler[jetstream.Msg]
	errs []error // failures queued for the next Next calls

	skipEpoch, skipStep int // batches before (skipEpoch, skipStep) are dropped

	mu          sync.Mutex
	outstanding map[BatchKey]*Batch // returned by Next, not yet acked
}

// SkipBefore makes Next acknowledge and drop every batch whose (epoch, step)
// is before (epoch, step): a rank resuming from a checkpoint at that step.
func (c *Consumer) SkipBefore(epoch, step int) { c.skipEpoch, c.skipStep = epoch, step }

func (c *Consumer) skipped(h ChunkHeader) bool {
	return h.Epoch < c.skipEpoch || (h.Epoch == c.skipEpoch && h.Step < c.skipStep)
}

// NewConsumer ensures the rank's durable consumer exists (EnsureConsumer) and
// starts pulling from it. Records are allocated from mem (nil: Go
// allocator). Close stops it.
func NewConsumer(ctx context.Context, js jetstream.JetStream, mem memory.Allocator, cfg ConsumerConfig) (*Consumer, error) {
	cons, err := EnsureConsumer(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	re, err := NewReassembler[jetstream.Msg](ReassemblerConfig{MaxBatchBytes: cfg.MaxBatchBytes, MaxPending: 8, Remember: 4096})
	if err != nil {
		return nil, err
	}
	it, err := cons.Messages(pullLimit(cfg, js.Conn().MaxPayload()))
	if err != nil {
		return nil, fmt.Errorf("proto: consume %s: %w", ConsumerName(cfg.Job, cfg.DPRank, cfg.MPRank), err)
	}
	if mem == nil {
		mem = memory.NewGoAllocator()
	}
	return &Consumer{cfg: cfg, mem: mem, it: it, re: re, outstanding: map[BatchKey]*Batch{}}, nil
}

// pullLimit bounds the client's pull buffer: PullMaxBytes (at least two
// messages of maxPayload) or else PullMaxMessages.
func pullLimit(cfg ConsumerConfig, maxPayload int64) jetstream.PullMessagesOpt {
	if cfg.PullMaxBytes > 0 {
		return jetstream.PullMaxBytes(max(cfg.PullMaxBytes, 2*int(maxPayload)))
	}
	return jetstream.PullMaxMessages(cfg.PullMaxMessages)
}

// Close stops pulling. Unacknowledged batches are redelivered later.
func (c *Consumer) Close() { c.it.Stop() }

// Next returns the next complete batch. The caller Releases its record and
// Acks it. A batch that fails verification gives a *BatchError (wrapping
// ErrChecksum, ErrChunkMissing, ...) and Next may be called again.
func (c *Consumer) Next(ctx context.Context) (*Batch, error) {
	for {
		if len(c.errs) > 0 {
			err := c.errs[0]
			c.errs = c.errs[1:]
			return nil, err
		}
		if err := c.checkPrefetch(); err != nil {
			return nil, err
		}
		m, err := c.pull(ctx)
		if err != nil {
			return nil, err
		}
		if m == nil { // pull timed out to let Expire run
			for _, e := range c.re.Expire(time.Now(), c.cfg.ChunkTimeout) {
				c.errs = append(c.errs, c.failed(e.Assembled, e.Err))
			}
			continue
		}
		a, err := c.re.Add(m.Headers(), m.Data(), m)
		for _, e := range c.re.Evicted() {
			c.errs = append(c.errs, c.failed(e.Assembled, e.Err))
		}
		switch {
		case a == nil && err != nil: // bad header or data: this chunk alone
			_ = m.Term()
			return nil, fmt.Errorf("proto: consume %s: %w", m.Subject(), err)
		case a == nil:
			continue
		case err != nil:
			return nil, c.failed(a, err)
		case a.Duplicate:
			c.redelivered(a.Header.BatchKey, m)
			continue
		case c.skipped(a.Header):
			for _, t := range a.Tags {
				_ = t.Ack()
			}
			continue
		}
		b, err := c.decode(a)
		if err != nil {
			return nil, err
		}
		return b, nil
	}
}

// pull waits for one message; it returns nil, nil after a short wait when
// incomplete batches may need expiring.
func (c *Consumer) pull(ctx context.Context) (jetstream.Msg, error) {
	wctx := ctx
	if c.re.Pending() > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, max(c.cfg.ChunkTimeout/4, 10*time.Millisecond))
		defer cancel()
	}
	m, err := c.it.Next(jetstream.NextContext(wctx))
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, nil
		}
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return nil, fmt.Errorf("proto: consume: %w", ErrClosed)
		}
		return nil, fmt.Errorf("proto: consume: %w", err)
	}
	return m, nil
}

func (c *Consumer) checkPrefetch() error {
	c.mu.Lock()
	out := 0
	for _, b := range c.outstanding {
		out += len(b.msgs)
	}
	c.mu.Unlock()
	if held := c.re.Held(); held > 0 && held+out >= c.cfg.MaxAckPending {
		return fmt.Errorf("proto: consume: %d chunks of incomplete batches and %d of unacked batches reach max_ack_pending %d (ack batches before Next, or raise it): %w",
			held, out, c.cfg.MaxAckPending, ErrPrefetchTooSmall)
	}
	return nil
}

// failed terminates the chunks of a batch that cannot be used.
func (c *Consumer) failed(a *Assembled[jetstream.Msg], err error) error {
	for _, m := range a.Tags {
		_ = m.Term()
	}
	return &BatchError{Key: a.Header.BatchKey, Gen: a.Header.Gen, Err: err}
}

func (c *Consumer) redelivered(k BatchKey, m jetstream.Msg) {
	c.mu.Lock()
	b := c.outstanding[k]
	c.mu.Unlock()
	if b == nil {
		_ = m.Ack() // batch already acknowledged (or replayed): drop the copy
		return
	}
	b.addRedelivery(m)
}

func (c *Consumer) forget(k BatchKey) {
	c.mu.Lock()
	delete(c.outstanding, k)
	c.mu.Unlock()
}

func (c *Consumer) decode(a *Assembled[jetstream.Msg]) (*Batch, error) {
	rec, err := DecodeIPC(c.mem, a.Payload)
	if err != nil {
		return nil, c.failed(a, err)
	}
	meta, err := ValidateRecord(rec)
	if err == nil {
		err = checkRecordKey(meta, rec.NumRows(), a.Header)
	}
	if err != nil {
		rec.Release()
		return nil, c.failed(a, err)
	}
	meta.Step, meta.MicroBatch = a.Header.Step, a.Header.MicroBatch
	b := &Batch{Header: a.Header, Meta: meta, Record: rec, c: c, msgs: a.Tags}
	c.mu.Lock()
	c.outstanding[a.Header.BatchKey] = b
	c.mu.Unlock()
	return b, nil
}

// checkRecordKey checks that the schema metadata names the header's batch.
func checkRecordKey(m BatchMeta, rows int64, h ChunkHeader) error {
	if m.Job != h.Job || m.Epoch != h.Epoch || m.DPRank != h.DPRank || m.MPRank != h.MPRank ||
		(rows > 0 && (m.Step != h.Step || m.MicroBatch != h.MicroBatch)) {
		return fmt.Errorf("proto: record of %s/e%d/s%d/mb%d/dp%d/mp%d under header %v: %w",
			m.Job, m.Epoch, m.Step, m.MicroBatch, m.DPRank, m.MPRank, h.BatchKey, ErrSchema)
	}
	return nil
}
