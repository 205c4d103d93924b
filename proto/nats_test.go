package proto

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// startServer runs an embedded JetStream server on 127.0.0.1 for the test.
func startServer(tb testing.TB, maxPayload int32) *server.Server {
	return testnats.Server(tb, testnats.Options{MaxPayload: maxPayload})
}

func connect(tb testing.TB, s *server.Server) (*nats.Conn, jetstream.JetStream) {
	return testnats.Connect(tb, s.ClientURL())
}

var checkFor = testnats.CheckFor

func testCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

type transport struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	pub *Publisher
	st  jetstream.Stream
}

func newTransport(t *testing.T, maxPayload int32, scfg func(*StreamConfig)) *transport {
	t.Helper()
	s := startServer(t, maxPayload)
	nc, js := connect(t, s)
	cfg := DefaultStreamConfig("job-1")
	cfg.Memory = true
	if scfg != nil {
		scfg(&cfg)
	}
	st, err := EnsureStream(testCtx(t), js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pcfg := DefaultPublisherConfig()
	pub, err := NewPublisher(nc, js, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	return &transport{nc: nc, js: js, pub: pub, st: st}
}

// publishBatch builds, encodes and publishes one batch; it returns the rows.
func (tr *transport) publishBatch(t *testing.T, meta BatchMeta, n int) ([]Row, PublishStats) {
	t.Helper()
	rows := testRows(meta, n)
	rec, err := BuildRecord(memory.DefaultAllocator, meta, rows)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Release()
	st, err := tr.pub.PublishRecord(testCtx(t), meta, 0, rec)
	if err != nil {
		t.Fatal(err)
	}
	return rows, st
}

func newConsumer(t *testing.T, js jetstream.JetStream, mem memory.Allocator, dp, mp int) *Consumer {
	t.Helper()
	c, err := NewConsumer(testCtx(t), js, mem, DefaultConsumerConfig("job-1", dp, mp))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// expectBatch reads one batch and checks its key and rows, then acks it.
func expectBatch(t *testing.T, c *Consumer, meta BatchMeta, rows []Row) {
	t.Helper()
	if err := readBatch(testCtx(t), c, meta, rows); err != nil {
		t.Fatal(err)
	}
}

// readBatch is expectBatch for other goroutines: it returns the failure.
func readBatch(ctx context.Context, c *Consumer, meta BatchMeta, rows []Row) error {
	b, err := c.Next(ctx)
	if err != nil {
		return fmt.Errorf("Next: %w", err)
	}
	defer b.Release()
	if got, want := b.Header.BatchKey, meta.Key(); got != want {
		return fmt.Errorf("batch key: got %v, want %v", got, want)
	}
	gotMeta, got, err := ReadRows(b.Record)
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(got, project(meta.Modality, rows)) || gotMeta.Step != meta.Step {
		return fmt.Errorf("batch %v: rows differ", meta.Key())
	}
	return b.Ack(ctx)
}

func streamMsgs(t *testing.T, st jetstream.Stream) uint64 {
	t.Helper()
	info, err := st.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func TestTransportTwoRanks(t *testing.T) {
	tr := newTransport(t, 0, nil)
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	type sent struct {
		meta BatchMeta
		rows []Row
	}
	var byRank [2][]sent
	for step := range 3 {
		for mb := range 2 {
			for dp := range 2 {
				meta := testMeta(ModalityAll, DTypeFloat16, []int{3, 8, 8})
				meta.Step, meta.MicroBatch, meta.DPRank, meta.MPRank = step, mb, dp, 0
				rows, _ := tr.publishBatch(t, meta, 3+dp)
				byRank[dp] = append(byRank[dp], sent{meta, rows})
			}
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	ctx := testCtx(t)
	for dp := range 2 {
		c := newConsumer(t, tr.js, mem, dp, 0)
		wg.Go(func() {
			for _, s := range byRank[dp] {
				if errs[dp] = readBatch(ctx, c, s.meta, s.rows); errs[dp] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	for dp, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", dp, err)
		}
	}
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := streamMsgs(t, tr.st); n != 0 {
			return errors.New("stream still holds acked chunks")
		}
		return nil
	})
}

func TestTransportChunksAtOneMegabyte(t *testing.T) {
	tr := newTransport(t, 1<<20, nil)
	if got, want := tr.nc.MaxPayload(), int64(1<<20); got != want {
		t.Fatalf("server max_payload: got %d, want %d", got, want)
	}
	meta := testMeta(ModalityAll, DTypeFloat32, []int{3, 224, 224})
	rows, st := tr.publishBatch(t, meta, 8) // 8 × 602112 bytes ≈ 4.8 MB
	if st.Chunks < 5 || st.Bytes < 4<<20 {
		t.Fatalf("publish stats %+v: want a multi-megabyte payload in ≥ 5 chunks", st)
	}
	if got, want := streamMsgs(t, tr.st), uint64(st.Chunks); got != want {
		t.Errorf("stream messages: got %d, want %d", got, want)
	}
	expectBatch(t, newConsumer(t, tr.js, nil, meta.DPRank, meta.MPRank), meta, rows)
}

func TestTransportCorruptChunk(t *testing.T) {
	tr := newTransport(t, 0, nil)
	meta := testMeta(ModalityText, "", nil)
	rec, err := BuildRecord(memory.DefaultAllocator, meta, testRows(meta, 50))
	if err != nil {
		t.Fatal(err)
	}
	payload, err := EncodeIPC(rec)
	rec.Release()
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := Chunk(meta.Key(), 0, payload, 256)
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(msgs[1].Data)
	bad[3] ^= 0xff
	msgs[1].Data = bad
	for _, m := range msgs {
		if _, err := tr.js.PublishMsg(testCtx(t), m); err != nil {
			t.Fatal(err)
		}
	}
	good := meta
	good.Step++
	rows, _ := tr.publishBatch(t, good, 4)
	c := newConsumer(t, tr.js, nil, meta.DPRank, meta.MPRank)
	_, err = c.Next(testCtx(t))
	var be *BatchError
	if !errors.Is(err, ErrChecksum) || !errors.As(err, &be) || be.Key != meta.Key() {
		t.Fatalf("got %v, want a BatchError for %v wrapping ErrChecksum", err, meta.Key())
	}
	expectBatch(t, c, good, rows)
}

func TestTransportDedupe(t *testing.T) {
	tr := newTransport(t, 0, nil)
	tr.pub.chunkSize = 4096 // several chunks per batch
	meta := testMeta(ModalityVision, DTypeUint8, []int{3, 64, 64})
	rows, first := tr.publishBatch(t, meta, 4)
	if first.Chunks < 3 || first.Duplicates != 0 {
		t.Fatalf("first publish: %+v, want ≥ 3 new chunks", first)
	}
	// Republish the same batch (same Nats-Msg-Ids): every chunk is dropped.
	again, err := tr.pub.Publish(testCtx(t), meta.Key(), 0, mustEncode(t, meta, rows))
	if err != nil {
		t.Fatal(err)
	}
	if again.Duplicates != again.Chunks || again.Chunks != first.Chunks {
		t.Errorf("republish: got %d duplicates of %d chunks, want all %d", again.Duplicates, again.Chunks, first.Chunks)
	}
	if got, want := streamMsgs(t, tr.st), uint64(first.Chunks); got != want {
		t.Errorf("stream messages: got %d, want %d", got, want)
	}
	c := newConsumer(t, tr.js, nil, meta.DPRank, meta.MPRank)
	expectBatch(t, c, meta, rows)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if b, err := c.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after the batch: got %v, %v, want no second copy", b, err)
	}
	// A deliberate replay (generation 1) is not deduplicated by the stream,
	// but the consumer drops it: the batch was already delivered.
	replay, err := tr.pub.Publish(testCtx(t), meta.Key(), 1, mustEncode(t, meta, rows))
	if err != nil || replay.Duplicates != 0 {
		t.Fatalf("replay: %+v, %v, want new chunks", replay, err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if b, err := c.Next(ctx2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after the replay: got %v, %v, want it dropped", b, err)
	}
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := streamMsgs(t, tr.st); n != 0 {
			return errors.New("replayed chunks not acked")
		}
		return nil
	})
}

func TestTransportBackpressure(t *testing.T) {
	const batches = 12
	tr := newTransport(t, 0, func(c *StreamConfig) { c.MaxBytes = 64 << 10 })
	tr.pub.chunkSize = 8 << 10
	meta := testMeta(ModalityAll, DTypeFloat16, []int{3, 16, 16}) // ~1.5 KiB per row
	var sent [][]Row
	var payloads [][]byte
	for step := range batches {
		meta.Step = step
		sent = append(sent, testRows(meta, 8))
		payloads = append(payloads, mustEncode(t, meta, sent[step]))
	}
	type result struct {
		stats PublishStats
		err   error
	}
	done := make(chan result, 1)
	ctx := testCtx(t)
	go func() {
		var total PublishStats
		for step := range batches {
			m := meta
			m.Step = step
			st, err := tr.pub.Publish(ctx, m.Key(), 0, payloads[step])
			total.Chunks += st.Chunks
			total.Retries += st.Retries
			if err != nil {
				done <- result{total, err}
				return
			}
		}
		done <- result{total, nil}
	}()
	// Without a consumer the stream fills up to MaxBytes and the publisher
	// keeps waiting.
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		info, err := tr.st.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Bytes < 40<<10 {
			return errors.New("stream not full yet")
		}
		return nil
	})
	select {
	case r := <-done:
		t.Fatalf("publisher finished %+v, %v while the stream was full", r.stats, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	c := newConsumer(t, tr.js, nil, meta.DPRank, meta.MPRank)
	for step := range batches {
		m := meta
		m.Step = step
		expectBatch(t, c, m, sent[step])
	}
	r := <-done
	if r.err != nil || r.stats.Retries == 0 {
		t.Fatalf("publisher: %+v, %v; want success after retries", r.stats, r.err)
	}
	t.Logf("publisher: %d chunks, %d retried", r.stats.Chunks, r.stats.Retries)
}

func TestKVRankStep(t *testing.T) {
	s := startServer(t, 0)
	_, js := connect(t, s)
	ctx := testCtx(t)
	kv, err := EnsureKV(ctx, js, "job-1", true, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := GetRankStep(ctx, kv, 1, 0); ok || err != nil {
		t.Fatalf("empty bucket: ok=%v err=%v", ok, err)
	}
	if err := PutRankStep(ctx, kv, 1, 0, 3, 117); err != nil {
		t.Fatal(err)
	}
	e, st, ok, err := GetRankStep(ctx, kv, 1, 0)
	if !ok || err != nil || e != 3 || st != 117 {
		t.Fatalf("got epoch %d step %d ok=%v err=%v, want 3 117", e, st, ok, err)
	}
}

func mustEncode(t *testing.T, meta BatchMeta, rows []Row) []byte {
	t.Helper()
	rec, err := BuildRecord(memory.DefaultAllocator, meta, rows)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Release()
	b, err := EncodeIPC(rec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
