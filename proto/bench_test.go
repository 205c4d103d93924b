package proto

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// benchMaxPayload is the embedded server's max_payload as the service
// configures it (pipeline/serve DefaultConfig: 8 MiB); the publisher chunks
// to it.
const benchMaxPayload = 8 << 20

// BenchmarkTransport measures throughput the way the service moves batches,
// pipelined. Per rank, one goroutine publishes b.N batches in step order on
// an in-process connection (as the service's rank publishers do, running
// ahead of the trainers up to the stream's byte limit) while that rank's
// consumer, on its own TCP connection, fetches, reassembles, verifies and
// decodes them and its training loop takes and acknowledges each (consumeN).
// The clock stops when every rank has acknowledged its last batch. The peer
// (mode=raw) moves the same bytes — the same encoded batches, one per rank
// and step — in the same chunk sizes as raw core-NATS messages from an
// in-process publisher to one TCP subscriber per rank, which confirms each
// complete batch; its publisher runs at most rawAhead batches ahead of the
// confirmations (core NATS has no flow control: without a bound a slow
// subscriber drops messages). mode=raw-hot is the peer as it was before
// issue 21: one payload published b.N times, which stays in the CPU cache
// and so moves faster than any sender of distinct batches can (for
// comparison, not a results key). Both use the service's server settings
// (max_payload 8 MiB); mode=jetstream uses the service's stream
// (DefaultStreamConfig: file store, 1 GiB), mode=jetstream-memory the same in
// memory (--stream-memory), for comparison. Bytes are counted once per rank:
// MB/s is bytes delivered to all ranks per wall second; cpu-ms/op is the
// process's CPU time (server and clients) per op, faults/op its page faults
// and csw/op its context switches. Payloads are encoded before the clock
// starts (b.N per rank: run it with -benchtime Nx, N small); with
// -args -transport.cpuprofile DIR each sub-benchmark writes a CPU profile of
// its timed part alone to DIR.
func BenchmarkTransport(b *testing.B) {
	const ranks = 2
	for _, rows := range []int{4, 32} {
		payload := mustEncodeB(b, benchMeta(0), testRows(benchMeta(0), rows))
		name := fmt.Sprintf("ranks=%d/rows=%d/mib=%.1f", ranks, rows, float64(len(payload))/(1<<20))
		b.Run("mode=core/"+name, func(b *testing.B) { benchCore(b, ranks, rows) })
		b.Run("mode=jetstream/"+name, func(b *testing.B) { benchJetStream(b, ranks, rows) })
		b.Run("mode=jetstream-memory/"+name, func(b *testing.B) { benchJetStreamStore(b, ranks, rows, true) })
		b.Run("mode=raw/"+name, func(b *testing.B) { benchRaw(b, ranks, rows) })
		b.Run("mode=raw-hot/"+name, func(b *testing.B) { benchRawHot(b, ranks, len(payload)) })
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

// benchPayloads encodes steps 0..n-1 of each rank: keys are unique per batch.
func benchPayloads(b *testing.B, ranks, rows, n int) [][][]byte {
	rowsOf := testRows(benchMeta(0), rows)
	out := make([][][]byte, ranks)
	for dp := range out {
		out[dp] = make([][]byte, n)
		for step := range n {
			m := benchMeta(dp)
			m.Step = step
			out[dp][step] = offHeap(b, mustEncodeB(b, m, rowsOf))
		}
	}
	return out
}

// connectInProcess connects in-process, as the service connects to its
// embedded server.
func connectInProcess(b *testing.B, s *server.Server) (*nats.Conn, jetstream.JetStream) {
	nc, err := nats.Connect("", nats.InProcessServer(s))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	return nc, js
}

func benchJetStream(b *testing.B, ranks, rows int) { benchJetStreamStore(b, ranks, rows, false) }

func benchJetStreamStore(b *testing.B, ranks, rows int, mem bool) {
	s := startServer(b, benchMaxPayload)
	nc, js := connectInProcess(b, s)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	scfg := DefaultStreamConfig("job-1")
	scfg.Memory = mem
	if _, err := EnsureStream(ctx, js, scfg); err != nil {
		b.Fatal(err)
	}
	pub, err := NewPublisher(nc, js, DefaultPublisherConfig())
	if err != nil {
		b.Fatal(err)
	}
	payloads := benchPayloads(b, ranks, rows, b.N)
	cons := make([]*Consumer, ranks)
	for dp := range ranks {
		_, cjs := connect(b, s) // a trainer rank has its own connection
		if cons[dp], err = NewConsumer(ctx, cjs, nil, DefaultConsumerConfig("job-1", dp, 0)); err != nil {
			b.Fatal(err)
		}
		defer cons[dp].Close()
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(payloads[0][0]) * ranks))
	b.ResetTimer()
	defer reportCPU(b)()
	defer profileTimed(b)()
	var work []func(context.Context) error
	for dp := range ranks {
		work = append(work, func(ctx context.Context) error {
			for step, p := range payloads[dp] {
				key := benchMeta(dp).Key()
				key.Step = step
				if _, err := pub.Publish(ctx, key, 0, p); err != nil {
					return err
				}
			}
			return nil
		}, func(ctx context.Context) error { return consumeN(ctx, cons[dp], b.N) })
	}
	if err := runAll(ctx, work...); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
}

// benchCore is the core data plane: each rank's Fetcher (its own TCP
// connection, a window of benchWindow batches) asks for its batches; an in-process
// responder, as the service, answers each fetch from the encoded payloads
// with SendBatch and each ack with an empty reply.
func benchCore(b *testing.B, ranks, rows int) {
	s := startServer(b, benchMaxPayload)
	nc, _ := connectInProcess(b, s)
	chunk, err := ChunkSize(nc.MaxPayload())
	if err != nil {
		b.Fatal(err)
	}
	// Epoch 0, one micro-batch a step (the plan order a Fetcher asks in);
	// the checksum is computed with the payload, as the service does.
	payloads, sums := make([][][]byte, ranks), make([][]uint32, ranks)
	rowsOf := testRows(benchMeta(0), rows)
	for dp := range payloads {
		for step := range b.N {
			m := benchMeta(dp)
			m.Epoch, m.Step, m.MicroBatch = 0, step, 0
			payloads[dp] = append(payloads[dp], offHeap(b, mustEncodeB(b, m, rowsOf)))
			sums[dp] = append(sums[dp], Checksum(payloads[dp][step]))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sendErr := make(chan error, 1)
	for dp := range ranks {
		subj, _ := FetchSubject("job-1", dp, 0)
		if _, err := nc.Subscribe(subj, func(m *nats.Msg) {
			var req FetchRequest
			if err := DecodeControl(m.Data, &req); err != nil || req.Step >= b.N {
				sendErr <- fmt.Errorf("bad fetch %q: %v", m.Data, err)
				return
			}
			if _, err := SendBatch(nc, m.Reply, req.Key(), 0, payloads[dp][req.Step], sums[dp][req.Step], chunk); err != nil {
				sendErr <- err
			}
		}); err != nil {
			b.Fatal(err)
		}
	}
	acks, _ := AckWildcard("job-1")
	if _, err := nc.Subscribe(acks, func(m *nats.Msg) { _ = m.Respond(nil) }); err != nil {
		b.Fatal(err)
	}
	fs := make([]*Fetcher, ranks)
	for dp := range ranks {
		cn, _ := connect(b, s) // a trainer rank has its own connection
		fc := DefaultFetcherConfig("job-1", dp, 0)
		fc.Window, fc.WindowBytes = benchWindow, benchWindowBytes
		if fs[dp], err = NewFetcher(cn, nil, fc); err != nil {
			b.Fatal(err)
		}
		defer fs[dp].Close()
		fs[dp].AddEpoch(0, b.N, 1)
		fs[dp].Start(0, 0)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(payloads[0][0]) * ranks))
	b.ResetTimer()
	defer reportCPU(b)()
	defer profileTimed(b)()
	var work []func(context.Context) error
	for dp := range ranks {
		work = append(work, func(ctx context.Context) error { return consumeN(ctx, fs[dp], b.N) })
	}
	work = append(work, func(ctx context.Context) error {
		select {
		case err := <-sendErr:
			return err
		case <-ctx.Done():
			return nil
		}
	})
	done, stop := context.WithCancel(ctx)
	defer stop()
	err = runAll(done, func(ctx context.Context) error {
		defer stop() // the consumers are done: stop watching for send errors
		return runAll(ctx, work[:ranks]...)
	}, work[ranks])
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
}

// reportCPU starts measuring the process's CPU time (user + system: server,
// publisher and consumers together); the function it returns reports it per
// op as cpu-ms/op, a figure that moves less than wall time on a shared
// machine, with the page faults (faults/op: fresh memory the kernel maps in)
// and context switches (csw/op) per op.
func reportCPU(b *testing.B) func() {
	start := rusage()
	return func() {
		end := rusage()
		cpu := time.Duration(end.Utime.Nano() + end.Stime.Nano() - start.Utime.Nano() - start.Stime.Nano())
		n := float64(b.N)
		b.ReportMetric(float64(cpu)/float64(time.Millisecond)/n, "cpu-ms/op")
		b.ReportMetric(float64(end.Minflt+end.Majflt-start.Minflt-start.Majflt)/n, "faults/op")
		b.ReportMetric(float64(end.Nvcsw+end.Nivcsw-start.Nvcsw-start.Nivcsw)/n, "csw/op")
	}
}

func rusage() syscall.Rusage {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru) // zero on error: the metrics read 0
	return ru
}

var timedProfile = flag.String("transport.cpuprofile", "", "directory for a CPU profile of each BenchmarkTransport sub-benchmark's timed part")

// profileTimed writes a CPU profile of the timed part of b to
// -transport.cpuprofile, if set: go test's -cpuprofile also covers the
// setup, which encodes every batch of the run. The last run of b (its
// largest b.N) is the one left in the file.
func profileTimed(b *testing.B) func() {
	if *timedProfile == "" {
		return func() {}
	}
	f, err := os.Create(*timedProfile + "/" + strings.ReplaceAll(b.Name(), "/", "_") + ".cpu")
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}

// benchPrefetch is how many decoded batches a rank's fetching goroutine may
// hold ahead of its trainer (the Python client's default prefetch).
const benchPrefetch = 2

// consumeN takes n batches in step order, as a trainer does with the
// Python client: one goroutine fetches, verifies and decodes up to
// benchPrefetch batches ahead; the other (the training loop) takes each,
// releases it and acknowledges it (Ack waits for the server's confirmation).
func consumeN(ctx context.Context, c interface {
	Next(context.Context) (*Batch, error)
}, n int) error {
	taken := make(chan *Batch, benchPrefetch)
	fetch := func(ctx context.Context) error {
		defer close(taken)
		for range n {
			bt, err := c.Next(ctx)
			if err != nil {
				return err
			}
			select {
			case taken <- bt:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	train := func(ctx context.Context) error {
		step := 0
		for bt := range taken {
			bt.Release()
			if bt.Header.Step != step {
				return fmt.Errorf("got step %d, want %d", bt.Header.Step, step)
			}
			if err := bt.Ack(ctx); err != nil {
				return err
			}
			step++
		}
		if step != n {
			return fmt.Errorf("took %d batches, want %d", step, n)
		}
		return nil
	}
	return runAll(ctx, fetch, train)
}

// runAll runs fns concurrently and returns the first error; an error cancels
// the context of the others.
func runAll(ctx context.Context, fns ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for _, f := range fns {
		wg.Go(func() {
			if err := f(ctx); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		})
	}
	wg.Wait()
	return first
}

// rawAhead bounds how many batches a raw publisher may be ahead of its
// subscriber's confirmations.
const rawAhead = 4

// benchRaw is the peer: the same encoded batches as benchCore, one per rank
// and step, published as raw chunks.
func benchRaw(b *testing.B, ranks, rows int) {
	payloads := benchPayloads(b, ranks, rows, b.N)
	runRaw(b, payloads, len(payloads[0][0]))
}

// benchRawHot is the peer before issue 21: one random payload of size
// bytes, published b.N times to every rank.
func benchRawHot(b *testing.B, ranks, size int) {
	data := randPayload(size, 9)
	payloads := make([][][]byte, ranks)
	for dp := range payloads {
		for range b.N {
			payloads[dp] = append(payloads[dp], data)
		}
	}
	runRaw(b, payloads, size)
}

// runRaw publishes payloads[dp] in order to rank dp's subscriber, every
// payload size bytes.
func runRaw(b *testing.B, payloads [][][]byte, size int) {
	s := startServer(b, benchMaxPayload)
	nc, _ := connectInProcess(b, s)
	chunk, err := ChunkSize(nc.MaxPayload())
	if err != nil {
		b.Fatal(err)
	}
	ranks := len(payloads)
	subErr := make(chan error, ranks)
	confirmed := make([]chan struct{}, ranks)
	for dp := range ranks {
		confirmed[dp] = rawSubscriber(b, s, dp, size, subErr)
	}
	b.ReportAllocs()
	b.SetBytes(int64(size * ranks))
	b.ResetTimer()
	defer reportCPU(b)()
	defer profileTimed(b)()
	var work []func(context.Context) error
	for dp := range ranks {
		subj, _ := BatchSubject("job-1", dp, 0)
		work = append(work, func(ctx context.Context) error {
			return rawPublish(ctx, nc, subj, payloads[dp], chunk, confirmed[dp], subErr)
		})
	}
	if err := runAll(context.Background(), work...); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
}

// rawSubscriber subscribes rank dp's subject on its own connection and
// confirms every size bytes received; a slow-consumer drop is reported on
// errs.
func rawSubscriber(b *testing.B, s *server.Server, dp, size int, errs chan<- error) chan struct{} {
	sc, err := nats.Connect(s.ClientURL(), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- fmt.Errorf("raw subscriber %d: %w", dp, err):
		default:
		}
	}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(sc.Close)
	done := make(chan struct{}, b.N)
	subj, _ := BatchSubject("job-1", dp, 0)
	n := 0
	sub, err := sc.Subscribe(subj, func(m *nats.Msg) {
		if n += len(m.Data); n >= size {
			n -= size
			done <- struct{}{}
		}
	})
	if err == nil {
		err = sub.SetPendingLimits(-1, -1)
	}
	if err == nil {
		err = sc.Flush()
	}
	if err != nil {
		b.Fatal(err)
	}
	return done
}

// rawPublish publishes the batches in chunks, at most rawAhead ahead of the
// confirmations, and returns when all are confirmed.
func rawPublish(ctx context.Context, nc *nats.Conn, subj string, batches [][]byte, chunk int, confirmed <-chan struct{}, errs <-chan error) error {
	wait := func() error {
		select {
		case <-confirmed:
			return nil
		case err := <-errs:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(30 * time.Second):
			return fmt.Errorf("raw subscriber of %s timed out", subj)
		}
	}
	for i, data := range batches {
		if i >= rawAhead {
			if err := wait(); err != nil {
				return err
			}
		}
		for off := 0; off < len(data); off += chunk {
			if err := nc.Publish(subj, data[off:min(off+chunk, len(data))]); err != nil {
				return err
			}
		}
	}
	for range min(len(batches), rawAhead) {
		if err := wait(); err != nil {
			return err
		}
	}
	return nil
}

// benchWindow and benchWindowBytes are the Fetcher's window in benchCore
// (DefaultFetcherConfig's).
const benchWindow, benchWindowBytes = 4, 32 << 20

// offHeap returns a copy of p in memory mapped outside the Go heap (unmapped
// when b ends). The benchmarks encode every batch of the run before the
// clock starts (hundreds of MiB); on the Go heap those would raise the
// garbage collector's target so far that every message buffer the consumers
// allocate is fresh memory the kernel has to fault in, a cost the service
// (an outbox of a few batches, in another process than the trainer) does not
// have. Both the core and the raw modes publish from these copies.
func offHeap(b *testing.B, p []byte) []byte {
	m, err := syscall.Mmap(-1, 0, len(p), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = syscall.Munmap(m) })
	copy(m, p)
	return m
}
