package proto

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testpeer"
)

func TestTransportRedeliveryAfterRestart(t *testing.T) {
	tr := newTransport(t, 0, nil)
	meta := testMeta(ModalityText, "", nil)
	var sent [][]Row
	for step := range 3 {
		m := meta
		m.Step = step
		rows, _ := tr.publishBatch(t, m, 3)
		sent = append(sent, rows)
	}
	cfg := DefaultConsumerConfig(meta.Job, meta.DPRank, meta.MPRank)
	cfg.AckWait = 300 * time.Millisecond
	ctx := testCtx(t)
	// First life: take step 0 and ack it, take step 1 and crash before acking.
	c1, err := NewConsumer(ctx, tr.js, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	m0 := meta
	m0.Step = 0
	expectBatch(t, c1, m0, sent[0])
	b, err := c1.Next(ctx)
	if err != nil || b.Header.Step != 1 {
		t.Fatalf("got %v, %v, want step 1", b, err)
	}
	b.Release()
	c1.Close()
	// Second life on the same durable: step 1 comes again, then step 2.
	c2, err := NewConsumer(ctx, tr.js, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	for step := 1; step < 3; step++ {
		m := meta
		m.Step = step
		expectBatch(t, c2, m, sent[step])
	}
}

func TestTransportSkipBefore(t *testing.T) {
	tr := newTransport(t, 0, nil)
	meta := testMeta(ModalityText, "", nil)
	var last []Row
	for step := range 4 {
		m := meta
		m.Step = step
		last, _ = tr.publishBatch(t, m, 2)
	}
	c := newConsumer(t, tr.js, nil, meta.DPRank, meta.MPRank)
	c.SkipBefore(meta.Epoch, 3)
	m := meta
	m.Step = 3
	expectBatch(t, c, m, last)
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := streamMsgs(t, tr.st); n != 0 {
			return fmt.Errorf("%d chunks left; skipped batches must be acked", n)
		}
		return nil
	})
}

func TestTransportMissingChunk(t *testing.T) {
	tr := newTransport(t, 0, nil)
	meta := testMeta(ModalityText, "", nil)
	msgs, err := Chunk(meta.Key(), 0, mustEncode(t, meta, testRows(meta, 40)), 512)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range msgs {
		if i == 1 {
			continue // lost
		}
		if _, err := tr.js.PublishMsg(testCtx(t), m); err != nil {
			t.Fatal(err)
		}
	}
	cfg := DefaultConsumerConfig(meta.Job, meta.DPRank, meta.MPRank)
	cfg.ChunkTimeout = 200 * time.Millisecond
	c, err := NewConsumer(testCtx(t), tr.js, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_, err = c.Next(testCtx(t))
	var be *BatchError
	if !errors.Is(err, ErrChunkMissing) || !errors.As(err, &be) || be.Key != meta.Key() {
		t.Fatalf("got %v, want a BatchError for %v wrapping ErrChunkMissing", err, meta.Key())
	}
	if d := time.Since(start); d < cfg.ChunkTimeout {
		t.Errorf("failed after %v, before the %v chunk timeout", d, cfg.ChunkTimeout)
	}
}

func TestTransportPrefetchTooSmall(t *testing.T) {
	tr := newTransport(t, 0, nil)
	tr.pub.chunkSize = 4096
	meta := testMeta(ModalityVision, DTypeUint8, []int{3, 64, 64}) // 12 KiB per row
	_, st := tr.publishBatch(t, meta, 4)
	cfg := DefaultConsumerConfig(meta.Job, meta.DPRank, meta.MPRank)
	cfg.MaxAckPending = st.Chunks - 2
	c, err := NewConsumer(testCtx(t), tr.js, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Next(testCtx(t)); !errors.Is(err, ErrPrefetchTooSmall) {
		t.Fatalf("got %v, want ErrPrefetchTooSmall", err)
	}
}

func TestPublishBatchLargerThanStream(t *testing.T) {
	tr := newTransport(t, 0, func(c *StreamConfig) { c.MaxBytes = 32 << 10 })
	tr.pub.chunkSize = 8 << 10
	meta := testMeta(ModalityVision, DTypeUint8, []int{3, 64, 64})
	_, err := tr.pub.Publish(testCtx(t), meta.Key(), 0, mustEncode(t, meta, testRows(meta, 4)))
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
}

// TestPythonPeerConsumes runs testdata/peer_consume.py, a minimal client
// written from docs/protocol.md with nats-py and pyarrow, against batches the
// Go Publisher wrote: the documented protocol is enough to read them.
func TestPythonPeerConsumes(t *testing.T) {
	py := testpeer.Python(t)
	s := startServer(t, 0)
	nc, js := connect(t, s)
	ctx := testCtx(t)
	scfg := DefaultStreamConfig("job-1")
	scfg.Memory = true
	st, err := EnsureStream(ctx, js, scfg)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := NewPublisher(nc, js, DefaultPublisherConfig())
	if err != nil {
		t.Fatal(err)
	}
	pub.chunkSize = 4096
	type want struct {
		Key      []any    `json:"key"`
		Chunks   int      `json:"chunks"`
		Modality string   `json:"modality"`
		IDs      []string `json:"ids"`
		PixelSum *int64   `json:"pixel_sum,omitempty"`
	}
	var wants []want
	for step, mod := range []Modality{ModalityVision, ModalityText, ModalityAll} {
		meta := testMeta(mod, DTypeUint8, []int{3, 16, 16})
		meta.Step, meta.DPRank, meta.MPRank = step, 1, 0
		rows := testRows(meta, 5)
		ps, err := pub.Publish(ctx, meta.Key(), step%2, mustEncode(t, meta, rows)) // gen 1 on step 1
		if err != nil {
			t.Fatal(err)
		}
		w := want{Key: []any{meta.Job, float64(meta.Epoch), float64(step), float64(meta.MicroBatch), 1.0, 0.0},
			Chunks: ps.Chunks, Modality: string(mod)}
		var sum int64
		for _, r := range rows {
			w.IDs = append(w.IDs, r.ID)
			for _, p := range r.Pixels {
				sum += int64(p)
			}
		}
		if mod.hasVision() {
			w.PixelSum = &sum
		}
		wants = append(wants, w)
	}
	if _, err := EnsureConsumer(ctx, js, DefaultConsumerConfig("job-1", 1, 0)); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, py, filepath.Join("testdata", "peer_consume.py"), s.ClientURL(), "job-1", "1", "0", "3")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python peer: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(wants) {
		t.Fatalf("peer printed %d batches, want %d:\n%s", len(lines), len(wants), out)
	}
	for i, line := range lines {
		var got want
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, wants[i]) {
			t.Errorf("batch %d: got %+v, want %+v", i, got, wants[i])
		}
	}
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := streamMsgs(t, st); n != 0 {
			return fmt.Errorf("%d chunks not acked by the peer", n)
		}
		return nil
	})
}
