package proto

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/nats-io/nats.go"
)

// FetcherConfig configures a Fetcher, the Go client of one rank on the core
// data plane.
type FetcherConfig struct {
	Job            string
	DPRank, MPRank int
	// Window is how many batches are asked for ahead of the one Next
	// returns: the consumer's flow control. The service sends nothing the
	// rank did not ask for.
	Window int
	// WindowBytes bounds the batches asked for ahead, counted at the size of
	// the last batch received (at least one is always asked for). Keep it
	// under the server's max_pending for the connection (64 MiB by default).
	WindowBytes int
	// Timeout is how long a requested batch may take to arrive before it is
	// asked for again (a lost request or payload; the service regenerates a
	// payload it no longer holds). After a reconnect every batch in flight is
	// asked for again at once, and after a fetch nobody received (the
	// server's no-responders status: the service is starting or not
	// reconnected yet) after a pause of 100 ms doubling to 2 s.
	Timeout time.Duration
	// MaxBatchBytes bounds one reassembled payload.
	MaxBatchBytes int64
}

// DefaultFetcherConfig returns a window of 4 batches and 32 MiB, a 10 s
// timeout and 1 GiB batches.
func DefaultFetcherConfig(job string, dp, mp int) FetcherConfig {
	return FetcherConfig{Job: job, DPRank: dp, MPRank: mp, Window: 4, WindowBytes: 32 << 20, Timeout: 10 * time.Second, MaxBatchBytes: 1 << 30}
}

// Validate checks the fields.
func (c FetcherConfig) Validate() error {
	if _, err := FetchSubject(c.Job, c.DPRank, c.MPRank); err != nil {
		return err
	}
	if c.Window < 1 || c.WindowBytes < 0 || c.Timeout <= 0 || c.MaxBatchBytes <= 0 {
		return fmt.Errorf("proto: fetcher config %+v: %w", c, ErrInvalidConfig)
	}
	return nil
}

type epochShape struct{ steps, microBatches int }

type inflight struct {
	key  BatchKey
	sent time.Time
}

// Fetcher reads one rank's batches on the core data plane: it asks for the
// next Window batches in plan order (FetchRequest), reassembles and verifies
// the chunks that come back on its inbox, and returns the batches in plan
// order. Batch.Ack sends an AckRequest. Next is not safe for concurrent use;
// Batch.Ack and AddEpoch may run on other goroutines.
type Fetcher struct {
	cfg      FetcherConfig
	nc       *nats.Conn
	mem      memory.Allocator
	sub      *nats.Subscription
	ch       chan *nats.Msg
	inbox    string
	fetchSub string
	ackSub   string
	re       *Reassembler[struct{}]
	bufs     *bufPool

	mu     sync.Mutex
	epochs map[int]epochShape

	want     BatchKey // the next batch Next returns
	next     BatchKey // the next batch to ask for
	asked    []inflight
	ready    map[BatchKey]*Assembled[struct{}]
	lastSize int
	reconn   uint64 // the connection's reconnect count when last checked
	// reconnected wakes Next when the connection reconnects (stopWatch ends
	// the watch).
	reconnected <-chan nats.Status
	stopWatch   func()
	// pause is how long after a no-responders status the batches in
	// flight are asked for again (0: none since the last chunk); paused is
	// when the pause in progress ends.
	pause  time.Duration
	paused time.Time
}

// noRespondersPause and noRespondersMax: the first and the longest pause
// before asking again after a fetch nobody received.
const (
	noRespondersPause = 100 * time.Millisecond
	noRespondersMax   = 2 * time.Second
)

// NewFetcher subscribes to a fresh inbox on nc. Call AddEpoch for every
// epoch the rank registered for and Start before Next. Records are allocated
// from mem (nil: Go allocator).
func NewFetcher(nc *nats.Conn, mem memory.Allocator, cfg FetcherConfig) (*Fetcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	re, err := NewReassembler[struct{}](ReassemblerConfig{MaxBatchBytes: cfg.MaxBatchBytes, MaxPending: 2 * cfg.Window, Remember: 4096})
	if err != nil {
		return nil, err
	}
	if mem == nil {
		mem = memory.NewGoAllocator()
	}
	f := &Fetcher{cfg: cfg, nc: nc, mem: mem, re: re, inbox: nc.NewInbox(), ch: make(chan *nats.Msg, 4096),
		epochs: map[int]epochShape{}, ready: map[BatchKey]*Assembled[struct{}]{}, reconn: nc.Stats().Reconnects}
	f.reconnected, f.stopWatch = watchReconnects(nc)
	f.bufs = newBufPool(2)
	re.alloc = f.bufs.get
	f.fetchSub, _ = FetchSubject(cfg.Job, cfg.DPRank, cfg.MPRank)
	f.ackSub, _ = AckSubject(cfg.Job, cfg.DPRank, cfg.MPRank)
	if f.sub, err = nc.ChanSubscribe(f.inbox, f.ch); err != nil {
		f.stopWatch()
		return nil, fmt.Errorf("proto: fetcher subscribe: %w", err)
	}
	// The window bounds what is in flight; let the client buffer it all.
	_ = f.sub.SetPendingLimits(-1, -1)
	return f, nil
}

// AddEpoch tells the Fetcher the shape of an epoch (from its register
// reply), so it may ask for that epoch's batches.
func (f *Fetcher) AddEpoch(epoch, steps, microBatches int) {
	f.mu.Lock()
	f.epochs[epoch] = epochShape{steps, microBatches}
	f.mu.Unlock()
}

// Start sets the first batch Next returns: micro-batch 0 of (epoch, step).
// Batches asked for before are forgotten.
func (f *Fetcher) Start(epoch, step int) {
	k := BatchKey{Job: f.cfg.Job, Epoch: epoch, Step: step, DPRank: f.cfg.DPRank, MPRank: f.cfg.MPRank}
	f.want, f.next, f.asked = k, k, nil
	clear(f.ready)
}

// Close unsubscribes. Batches not acknowledged are sent again to whoever
// asks for them.
func (f *Fetcher) Close() {
	f.stopWatch()
	_ = f.sub.Unsubscribe()
}

// after returns the key after k in plan order; ok is false when k is the
// last batch of the epochs known so far.
func (f *Fetcher) after(k BatchKey) (BatchKey, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sh, known := f.epochs[k.Epoch]
	if !known {
		return k, false
	}
	k.MicroBatch++
	if k.MicroBatch < sh.microBatches {
		return k, true
	}
	k.MicroBatch, k.Step = 0, k.Step+1
	if k.Step < sh.steps {
		return k, true
	}
	k.Epoch, k.Step = k.Epoch+1, 0
	_, known = f.epochs[k.Epoch]
	return k, known
}

func (f *Fetcher) inPlan(k BatchKey) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	sh, ok := f.epochs[k.Epoch]
	return ok && k.Step < sh.steps && k.MicroBatch < sh.microBatches
}

func (f *Fetcher) ask(k BatchKey) error {
	b, err := json.Marshal(NewFetchRequest(k))
	if err != nil {
		return err
	}
	if err := f.nc.PublishRequest(f.fetchSub, f.inbox, b); err != nil {
		return fmt.Errorf("proto: fetch %v: %w", k, err)
	}
	return nil
}

// fill asks for batches until the window is full.
func (f *Fetcher) fill() error {
	limit := f.cfg.Window
	if f.lastSize > 0 && f.cfg.WindowBytes > 0 {
		limit = max(1, min(limit, f.cfg.WindowBytes/f.lastSize))
	}
	for len(f.asked) < limit && f.inPlan(f.next) {
		if err := f.ask(f.next); err != nil {
			return err
		}
		f.asked = append(f.asked, inflight{f.next, time.Now()})
		f.next, _ = f.after(f.next) // past the known epochs: inPlan waits for AddEpoch
	}
	return nil
}

// retry asks again for every batch asked for more than Timeout ago, and for
// every one after the connection reconnected (requests and answers in flight
// were lost); it returns how long until the oldest remaining one times out.
func (f *Fetcher) retry(now time.Time) (time.Duration, error) {
	wait := f.cfg.Timeout
	if n := f.nc.Stats().Reconnects; n != f.reconn {
		f.reconn = n
		for i := range f.asked {
			f.asked[i].sent = time.Time{}
		}
	}
	for i := range f.asked {
		a := &f.asked[i]
		if _, done := f.ready[a.key]; done {
			continue
		}
		if left := f.cfg.Timeout - now.Sub(a.sent); left > 0 {
			wait = min(wait, left)
			continue
		}
		if err := f.ask(a.key); err != nil {
			return 0, err
		}
		a.sent = now
	}
	return wait, nil
}

// Next returns the next batch in plan order, waiting for it. The caller
// Releases its record and Acks it once applied.
func (f *Fetcher) Next(ctx context.Context) (*Batch, error) {
	for {
		if a := f.ready[f.want]; a != nil {
			delete(f.ready, f.want)
			return f.deliver(a)
		}
		if !f.inPlan(f.want) {
			return nil, fmt.Errorf("proto: fetch %v: not in a registered epoch: %w", f.want, ErrControl)
		}
		if err := f.fill(); err != nil {
			return nil, err
		}
		wait, err := f.retry(time.Now())
		if err != nil {
			return nil, err
		}
		t := time.NewTimer(wait)
		select {
		case m := <-f.ch:
			t.Stop()
			f.take(m, time.Now())
		case <-f.reconnected: // retry asks for every batch in flight again
			t.Stop()
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// take adds one chunk; a completed batch of the window goes to ready, a
// failed one is asked for again at once. A no-responders status makes every
// batch in flight due after a pause.
func (f *Fetcher) take(m *nats.Msg, now time.Time) {
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		f.noResponders(now)
		return
	}
	f.pause = 0
	a, err := f.re.Add(m.Header, m.Data, struct{}{})
	for _, e := range f.re.Evicted() {
		f.reask(e.Header.BatchKey)
	}
	switch {
	case a == nil: // incomplete, or a bad chunk alone (its batch times out and is asked for again)
	case err != nil:
		f.reask(a.Header.BatchKey)
	case a.Duplicate:
	case f.isAsked(a.Header.BatchKey):
		f.ready[a.Header.BatchKey] = a
		f.lastSize = len(a.Payload)
	}
}

// noResponders handles the server's answer to a fetch that nobody
// subscribed to: the service is starting, or has not reconnected yet after
// an outage the rank's connection came back from first. The fetch was
// dropped, so every batch in flight is asked for again after a pause
// (noRespondersPause, doubled after each pause that ended with another
// no-responders, up to noRespondersMax) instead of after Timeout.
func (f *Fetcher) noResponders(now time.Time) {
	if f.pause == 0 {
		f.pause = noRespondersPause
	} else if !now.Before(f.paused) { // a fetch asked again after the last pause was not received either
		f.pause = min(2*f.pause, noRespondersMax)
	}
	if !now.Before(f.paused) {
		f.paused = now.Add(f.pause)
	}
	due := f.paused.Add(-f.cfg.Timeout) // sent as if it timed out at paused
	for i := range f.asked {
		if f.asked[i].sent.After(due) {
			f.asked[i].sent = due
		}
	}
}

func (f *Fetcher) isAsked(k BatchKey) bool {
	for _, a := range f.asked {
		if a.key == k {
			return true
		}
	}
	return false
}

func (f *Fetcher) reask(k BatchKey) {
	for i := range f.asked {
		if f.asked[i].key == k {
			f.asked[i].sent = time.Time{} // due now
		}
	}
}

func (f *Fetcher) deliver(a *Assembled[struct{}]) (*Batch, error) {
	for i, x := range f.asked {
		if x.key == a.Header.BatchKey {
			f.asked = append(f.asked[:i], f.asked[i+1:]...)
			break
		}
	}
	f.want, _ = f.after(f.want)
	var release func()
	if a.Header.Count > 1 { // the payload is a buffer of the pool
		payload := a.Payload
		release = func() { f.bufs.put(payload) }
	}
	rec, err := decodeIPC(f.mem, a.Payload, release)
	if err != nil {
		return nil, &BatchError{Key: a.Header.BatchKey, Gen: a.Header.Gen, Err: err}
	}
	meta, err := ValidateRecord(rec)
	if err == nil {
		err = checkRecordKey(meta, rec.NumRows(), a.Header)
	}
	if err != nil {
		rec.Release()
		return nil, &BatchError{Key: a.Header.BatchKey, Gen: a.Header.Gen, Err: err}
	}
	meta.Step, meta.MicroBatch = a.Header.Step, a.Header.MicroBatch
	return &Batch{Header: a.Header, Meta: meta, Record: rec, fetch: f}, nil
}

// ack tells the service every batch up to k is applied and waits for its
// answer. An ack is idempotent: it is sent again when the connection
// reconnects before the answer came, or after Timeout (requestAgain).
func (f *Fetcher) ack(ctx context.Context, k BatchKey) error {
	b, err := json.Marshal(AckRequest(NewFetchRequest(k)))
	if err != nil {
		return err
	}
	if _, err := requestAgain(ctx, f.nc, f.ackSub, b, f.cfg.Timeout); err != nil {
		return fmt.Errorf("proto: ack %v: %w", k, err)
	}
	return nil
}
