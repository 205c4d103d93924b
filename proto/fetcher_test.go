package proto

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/nats-io/nats.go"
)

// fakeSender answers a rank's fetches from encoded payloads (epoch 0, two
// micro-batches a step), misbehaving as told: dropping the first request
// for some keys, corrupting the first answer for others.
type fakeSender struct {
	mu       sync.Mutex
	payloads map[BatchKey][]byte
	drop     map[BatchKey]bool // first request ignored
	corrupt  map[BatchKey]bool // first answer's chunk 0 flipped
	truncate map[BatchKey]bool // first answer's chunk 1 cut short
	shuffle  map[BatchKey]bool // chunks sent last first, chunk 0 twice
	asked    map[BatchKey]int
	acked    []BatchKey
}

// serve subscribes to the rank's fetch and ack subjects on nc and returns
// the subscriptions.
func (f *fakeSender) serve(t *testing.T, nc *nats.Conn, chunk int) []*nats.Subscription {
	subj, _ := FetchSubject("job-1", 1, 0)
	fsub, err := nc.Subscribe(subj, func(m *nats.Msg) {
		var req FetchRequest
		if err := DecodeControl(m.Data, &req); err != nil {
			t.Errorf("fetch: %v", err)
			return
		}
		k := req.Key()
		f.mu.Lock()
		f.asked[k]++
		n, p := f.asked[k], f.payloads[k]
		f.mu.Unlock()
		if n == 1 && f.drop[k] {
			return
		}
		msgs, err := Chunk(k, 0, p, chunk)
		if err != nil {
			t.Error(err)
			return
		}
		if f.shuffle[k] {
			slices.Reverse(msgs)
			msgs = append(msgs, msgs[len(msgs)-1])
		}
		for _, c := range msgs {
			c.Subject = m.Reply
			h, _ := ParseChunkHeader(c.Header)
			if h.Index == 0 && n == 1 && f.corrupt[k] {
				c.Data = append([]byte{c.Data[0] ^ 0xff}, c.Data[1:]...)
			}
			if h.Index == 1 && n == 1 && f.truncate[k] {
				c.Data = c.Data[:len(c.Data)-1]
			}
			if err := nc.PublishMsg(c); err != nil {
				t.Error(err)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	acks, _ := AckSubject("job-1", 1, 0)
	asub, err := nc.Subscribe(acks, func(m *nats.Msg) {
		var a AckRequest
		if err := DecodeControl(m.Data, &a); err != nil {
			t.Errorf("ack: %v", err)
		}
		f.mu.Lock()
		f.acked = append(f.acked, a.Key())
		f.mu.Unlock()
		_ = m.Respond(nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return []*nats.Subscription{fsub, asub}
}

// The Fetcher returns a rank's batches in plan order whatever goes wrong on
// the way: a lost request, a corrupted payload and a truncated chunk are
// asked for again, chunks out of order and repeated are put together, and
// every batch is acknowledged to the sender. A record still held when later
// batches arrive keeps its bytes (its buffer is reused only once released).
func TestFetcherAsksAgainAndKeepsPlanOrder(t *testing.T) {
	s := startServer(t, 64<<10)
	snc, _ := connect(t, s)
	const steps, mbs = 4, 2
	f := &fakeSender{payloads: map[BatchKey][]byte{}, asked: map[BatchKey]int{}}
	var order []BatchKey
	for step := range steps {
		for mb := range mbs {
			m := testMeta(ModalityAll, DTypeUint8, []int{3, 32, 32})
			m.Epoch, m.Step, m.MicroBatch = 0, step, mb
			f.payloads[m.Key()] = mustEncode(t, m, testRows(m, 40)) // ~120 KiB: several 63 KiB chunks
			order = append(order, m.Key())
		}
	}
	f.drop = map[BatchKey]bool{order[1]: true, order[6]: true}
	f.corrupt = map[BatchKey]bool{order[3]: true}
	f.truncate = map[BatchKey]bool{order[4]: true}
	f.shuffle = map[BatchKey]bool{order[2]: true, order[5]: true}
	chunk, err := ChunkSize(snc.MaxPayload())
	if err != nil {
		t.Fatal(err)
	}
	f.serve(t, snc, chunk)
	nc, _ := connect(t, s)
	cfg := DefaultFetcherConfig("job-1", 1, 0)
	cfg.Window, cfg.Timeout = 3, 300*time.Millisecond
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	fe, err := NewFetcher(nc, mem, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer fe.Close()
	fe.AddEpoch(0, steps, mbs)
	fe.Start(0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var held *Batch // released one batch late
	for i, want := range order {
		b, err := fe.Next(ctx)
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		if got := b.Header.BatchKey; got != want {
			t.Fatalf("batch %d is %v, want %v", i, got, want)
		}
		if rows := b.Record.NumRows(); rows != 40 {
			t.Errorf("batch %v: %d rows, want 40", want, rows)
		}
		if held != nil {
			checkSameRecord(t, held, f.payloads[held.Header.BatchKey])
			held.Release()
		}
		held = b
		if err := b.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	checkSameRecord(t, held, f.payloads[held.Header.BatchKey])
	held.Release()
	if _, err := fe.Next(ctx); err == nil {
		t.Error("Next past the registered epochs: no error")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range []BatchKey{order[1], order[3], order[4], order[6]} {
		if f.asked[k] < 2 {
			t.Errorf("%v asked for %d times, want ≥ 2 (lost, corrupt or truncated the first time)", k, f.asked[k])
		}
	}
	if len(f.acked) != len(order) || f.acked[len(order)-1] != order[len(order)-1] {
		t.Errorf("acked %v, want every batch in order", f.acked)
	}
}

// checkSameRecord checks that b's record still holds what payload encodes.
func checkSameRecord(t *testing.T, b *Batch, payload []byte) {
	t.Helper()
	got, err := EncodeIPC(b.Record)
	if err != nil || !bytes.Equal(got, payload) {
		t.Errorf("batch %v: record re-encodes to %d bytes (%v), differing from the %d sent", b.Header.BatchKey, len(got), err, len(payload))
	}
}

// After a reconnect the Fetcher asks again at once for the batches in
// flight (their fetches or payloads may have left with the old connection),
// not after its Timeout: the service got the fetch and its answer was lost
// in the outage; or the service is not back yet when the rank is (its
// subscription is gone), so the fetch asked again at the reconnect gets the
// server's no responders, and the Fetcher asks again after a short pause.
func TestFetcherAsksAgainAfterReconnect(t *testing.T) {
	for _, serviceBack := range []time.Duration{0, time.Second} {
		name := "service reconnects"
		if serviceBack > 0 {
			name = "service back after the rank"
		}
		t.Run(name, func(t *testing.T) {
			o := newOutage(t)
			svc, rank := o.connect(), o.connect()
			m := testMeta(ModalityAll, DTypeUint8, []int{3, 8, 8})
			m.Epoch, m.Step, m.MicroBatch = 0, 0, 0
			k := m.Key()
			f := &fakeSender{payloads: map[BatchKey][]byte{k: mustEncode(t, m, testRows(m, 4))},
				drop: map[BatchKey]bool{k: true}, asked: map[BatchKey]int{}}
			subs := f.serve(t, svc, 64<<10)
			cfg := DefaultFetcherConfig("job-1", 1, 0)
			cfg.Window, cfg.Timeout = 1, time.Minute // far beyond the test's context
			fe, err := NewFetcher(rank, nil, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer fe.Close()
			fe.AddEpoch(0, 1, 1)
			fe.Start(0, 0)
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			type result struct {
				b   *Batch
				err error
			}
			done := make(chan result, 1)
			t0 := time.Now()
			go func() {
				b, err := fe.Next(ctx)
				done <- result{b, err}
			}()
			checkFor(t, 5*time.Second, 10*time.Millisecond, func() error { // the first fetch arrived and was dropped
				f.mu.Lock()
				defer f.mu.Unlock()
				if f.asked[k] == 0 {
					return errors.New("no fetch yet")
				}
				return nil
			})
			if serviceBack > 0 {
				for _, s := range subs {
					_ = s.Unsubscribe()
				}
			}
			o.restart()
			if serviceBack > 0 {
				time.Sleep(serviceBack)
				f.serve(t, svc, 64<<10)
			}
			r := <-done
			if r.err != nil {
				t.Fatalf("after %v: %v", time.Since(t0).Round(time.Millisecond), r.err)
			}
			defer r.b.Release()
			if r.b.Header.BatchKey != k {
				t.Errorf("got %v, want %v", r.b.Header.BatchKey, k)
			}
			t.Logf("answered %v after the first fetch", time.Since(t0).Round(time.Millisecond))
		})
	}
}
