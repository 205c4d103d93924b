package proto

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/nats-io/nats.go"
)

func benchMeta(dp int) BatchMeta {
	m := testMeta(ModalityAll, DTypeFloat16, []int{3, 224, 224})
	m.DPRank, m.MPRank = dp, 0
	return m
}

func BenchmarkBuildRecord(b *testing.B) {
	for _, n := range []int{8, 64} {
		meta := benchMeta(0)
		rows := testRows(meta, n)
		size := 0
		for _, r := range rows {
			size += len(r.Pixels) + 4*len(r.InputIDs)
		}
		b.Run(fmt.Sprintf("dtype=float16/rows=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				rec, err := BuildRecord(memory.DefaultAllocator, meta, rows)
				if err != nil {
					b.Fatal(err)
				}
				payload, err := EncodeIPC(rec)
				rec.Release()
				if err != nil || len(payload) < size {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTransport moves one encoded batch per rank per iteration through
// an embedded JetStream server (Publisher → stream → Consumer.Next, decode,
// Ack) and, for comparison, the same bytes as raw core-NATS messages of the
// same chunk size to one subscriber per rank. Bytes are counted once per
// rank.
func BenchmarkTransport(b *testing.B) {
	const ranks = 2
	for _, rows := range []int{4, 32} {
		payload := mustEncodeB(b, benchMeta(0), testRows(benchMeta(0), rows))
		name := fmt.Sprintf("ranks=%d/rows=%d/mib=%.1f", ranks, rows, float64(len(payload))/(1<<20))
		b.Run("mode=jetstream/"+name, func(b *testing.B) { benchJetStream(b, ranks, rows) })
		b.Run("mode=raw/"+name, func(b *testing.B) { benchRaw(b, ranks, len(payload)) })
	}
}

func mustEncodeB(b *testing.B, meta BatchMeta, rows []Row) []byte {
	rec, err := BuildRecord(memory.DefaultAllocator, meta, rows)
	if err != nil {
		b.Fatal(err)
	}
	defer rec.Release()
	p, err := EncodeIPC(rec)
	if err != nil {
		b.Fatal(err)
	}
	return p
}

func benchJetStream(b *testing.B, ranks, rows int) {
	s := startServer(b, 0)
	nc, js := connect(b, s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	scfg := DefaultStreamConfig("job-1")
	scfg.Memory = true
	if _, err := EnsureStream(ctx, js, scfg); err != nil {
		b.Fatal(err)
	}
	pub, err := NewPublisher(nc, js, DefaultPublisherConfig())
	if err != nil {
		b.Fatal(err)
	}
	payloads := make([][]byte, ranks)
	rowsOf := testRows(benchMeta(0), rows)
	got := make(chan error, 64)
	for dp := range ranks {
		payloads[dp] = mustEncodeB(b, benchMeta(dp), rowsOf)
		c, err := NewConsumer(ctx, js, nil, DefaultConsumerConfig("job-1", dp, 0))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		go func() {
			for {
				bt, err := c.Next(ctx)
				if err != nil {
					if ctx.Err() == nil {
						got <- err
					}
					return
				}
				bt.Release()
				got <- bt.Ack(ctx)
			}
		}()
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(payloads[0]) * ranks))
	step := 0
	for b.Loop() {
		b.StopTimer() // a fresh record per step: keys are unique per batch
		for dp := range ranks {
			m := benchMeta(dp)
			m.Step = step
			payloads[dp] = mustEncodeB(b, m, rowsOf)
		}
		b.StartTimer()
		for dp := range ranks {
			key := benchMeta(dp).Key()
			key.Step = step
			if _, err := pub.Publish(ctx, key, 0, payloads[dp]); err != nil {
				b.Fatal(err)
			}
		}
		step++
		for range ranks {
			if err := <-got; err != nil {
				b.Fatal(err)
			}
		}
	}
}

func benchRaw(b *testing.B, ranks, size int) {
	s := startServer(b, 0)
	nc, _ := connect(b, s)
	sub, err := nats.Connect(s.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	chunk, _ := ChunkSize(nc.MaxPayload())
	data := randPayload(size, 9)
	done := make(chan struct{}, 64)
	for dp := range ranks {
		subj, _ := BatchSubject("job-1", dp, 0)
		n := 0
		if _, err := sub.Subscribe(subj, func(m *nats.Msg) {
			if n += len(m.Data); n >= size {
				n = 0
				done <- struct{}{}
			}
		}); err != nil {
			b.Fatal(err)
		}
	}
	if err := sub.Flush(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(size * ranks))
	for b.Loop() {
		for dp := range ranks {
			subj, _ := BatchSubject("job-1", dp, 0)
			for off := 0; off < size; off += chunk {
				if err := nc.Publish(subj, data[off:min(off+chunk, size)]); err != nil {
					b.Fatal(err)
				}
			}
		}
		for range ranks {
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				b.Fatal("raw subscriber timed out")
			}
		}
	}
}
