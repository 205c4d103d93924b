package proto

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"stream full", &jetstream.APIError{Code: 400, ErrorCode: errCodeStreamFull}, true},
		{"inbound queue full", &jetstream.APIError{Code: 429, ErrorCode: errCodeTooManyRequests}, true},
		{"wrapped inbound queue full", fmt.Errorf("publish: %w", &jetstream.APIError{Code: 429, ErrorCode: errCodeTooManyRequests}), true},
		{"no responders", nats.ErrNoResponders, true},
		{"ack timeout", jetstream.ErrAsyncPublishTimeout, true},
		{"wrong last sequence", &jetstream.APIError{Code: 400, ErrorCode: 10071}, false},
		{"message too large", &jetstream.APIError{Code: 400, ErrorCode: 10054}, false},
		{"other", errors.New("boom"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := retryable(tc.err); got != tc.want {
				t.Fatalf("retryable(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// TestReassemblerPayloadCopies checks that a single-chunk batch is handed on
// without a copy and a multi-chunk one is joined into a new buffer, both
// verified and equal to what was chunked.
func TestReassemblerPayloadCopies(t *testing.T) {
	key := testMeta(ModalityAll, DTypeFloat16, nil).Key()
	for _, tc := range []struct {
		size, chunk, wantChunks int
	}{
		{size: 10_000, chunk: 10_000, wantChunks: 1},
		{size: 10_000, chunk: 1 << 20, wantChunks: 1},
		{size: 10_000, chunk: 4096, wantChunks: 3},
	} {
		t.Run(fmt.Sprintf("size=%d/chunk=%d", tc.size, tc.chunk), func(t *testing.T) {
			payload := randPayload(tc.size, uint64(tc.chunk))
			msgs, err := Chunk(key, 0, payload, tc.chunk)
			if err != nil || len(msgs) != tc.wantChunks {
				t.Fatalf("Chunk: %d messages, %v; want %d", len(msgs), err, tc.wantChunks)
			}
			r, err := NewReassembler[int](DefaultReassemblerConfig())
			if err != nil {
				t.Fatal(err)
			}
			var a *Assembled[int]
			var first []byte
			for i, m := range msgs {
				data := bytes.Clone(m.Data) // as received: a buffer of its own
				if i == 0 {
					first = data
				}
				if a, err = r.Add(m.Header, data, i); err != nil {
					t.Fatal(err)
				}
			}
			if a == nil || !bytes.Equal(a.Payload, payload) {
				t.Fatalf("reassembled %v, want the %d chunked bytes", a, tc.size)
			}
			if aliased := unsafe.SliceData(a.Payload) == unsafe.SliceData(first); aliased != (tc.wantChunks == 1) {
				t.Fatalf("payload aliases the first chunk: %v, want %v", aliased, tc.wantChunks == 1)
			}
		})
	}
}

// TestConsumerPullStaysUnderMaxPending: with 8 MiB chunks, a pull buffer
// counted in messages (64) let the server queue far more than its
// max_pending (64 MiB) for the consumer's connection; the server then
// dropped the connection as a slow consumer, and the chunks in flight came
// back only after AckWait (minutes). The default pull buffer is bounded in
// bytes.
func TestConsumerPullStaysUnderMaxPending(t *testing.T) {
	const batches = 12 // about 110 MiB queued before the consumer starts
	s := startServer(t, 8<<20)
	nc, js := connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	scfg := DefaultStreamConfig("job-1")
	scfg.Memory = true
	if _, err := EnsureStream(ctx, js, scfg); err != nil {
		t.Fatal(err)
	}
	pub, err := NewPublisher(nc, js, DefaultPublisherConfig())
	if err != nil {
		t.Fatal(err)
	}
	rows := testRows(benchMeta(0), 32)
	for step := range batches {
		m := benchMeta(0)
		m.Step = step
		rec, err := BuildRecord(memory.DefaultAllocator, m, rows)
		if err != nil {
			t.Fatal(err)
		}
		_, err = pub.PublishRecord(ctx, m, 0, rec)
		rec.Release()
		if err != nil {
			t.Fatal(err)
		}
	}
	var drops atomic.Int32
	cnc, err := nats.Connect(s.ClientURL(), nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
		if err != nil {
			drops.Add(1)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer cnc.Close()
	cjs, err := jetstream.New(cnc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConsumer(ctx, cjs, nil, DefaultConsumerConfig("job-1", 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for step := range batches {
		bctx, bcancel := context.WithTimeout(ctx, 10*time.Second) // far below AckWait
		bt, err := c.Next(bctx)
		if err == nil {
			bt.Release()
			if bt.Header.Step != step {
				err = fmt.Errorf("step %d, want %d", bt.Header.Step, step)
			} else {
				err = bt.Ack(bctx)
			}
		}
		bcancel()
		if err != nil {
			t.Fatalf("batch %d: %v (%d disconnects)", step, err, drops.Load())
		}
	}
	if n := drops.Load(); n > 0 {
		t.Fatalf("consumer connection dropped %d times", n)
	}
}
