package serve

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// stepBarrier lets a rank apply step s only once every rank holds step s, as
// the trainers' collectives do.
type stepBarrier struct {
	mu    sync.Mutex
	ranks int
	held  map[[2]int]int
	ready map[[2]int]chan struct{}
}

func newStepBarrier(ranks int) *stepBarrier {
	return &stepBarrier{ranks: ranks, held: map[[2]int]int{}, ready: map[[2]int]chan struct{}{}}
}

func (b *stepBarrier) wait(ctx context.Context, k proto.BatchKey) error {
	key := [2]int{k.Epoch, k.Step}
	b.mu.Lock()
	ch, ok := b.ready[key]
	if !ok {
		ch = make(chan struct{})
		b.ready[key] = ch
	}
	b.held[key]++
	if b.held[key] == b.ranks {
		close(ch)
	}
	b.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestLockstepTrainersSmallStream: trainers that wait for each other at every
// step (a collective) while holding their step unacknowledged, and a stream
// that holds only a few steps. Were one rank's publisher free to run ahead, its
// future batches could fill the stream while another rank's current batch
// waits for room, and nothing would move until JetStream redelivered after
// ack_wait (the stall seen in `make demo`). The service publishes in step order,
// so the epoch finishes long before ack_wait. On the core data plane the outbox
// always takes the batch a waiting rank needs next.
func TestLockstepTrainersSmallStream(t *testing.T) {
	for _, plane := range dataPlanes {
		t.Run(plane, func(t *testing.T) { lockstepSmallStream(t, plane) })
	}
}

func lockstepSmallStream(t *testing.T, plane string) {
	cfg := testConfig(t, corpus(t, 240), 2, 1, "colocated")
	cfg.DataPlane = plane
	cfg.Recalibrate = -1
	cfg.QuarantineDir = t.TempDir()
	cfg.Pipeline.Image.Policy, cfg.Pipeline.Image.MaxPixels = "dynamic", 128*128
	cfg.StreamMaxBytes = 1200 << 10 // 1.5 steps of up to 800 KiB (2 ranks × 2 micro-batches × 2 samples × 96 KiB)
	cfg.AckWait = 5 * time.Minute
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	bar := newStepBarrier(cfg.ranks())
	trs := runTrainersWith(t, ctx, cfg, r.s.ClientURL(), []int{0}, true, func(tr *trainer) {
		tr.barrier = bar.wait
		tr.stepDelay = 5 * time.Millisecond
	})
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	checkDelivery(t, cfg, trs, 0, shardExpectation(t, cfg, 0))
}

// lockedBuffer is an io.Writer safe for the service's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A stream too small for two steps is reported, since lockstep trainers
// would stall on it; a large one is not.
func TestWarnsWhenStreamHoldsFewerThanTwoSteps(t *testing.T) {
	input := corpus(t, 80)
	for _, tc := range []struct {
		maxBytes int64
		warn     bool
	}{{1200 << 10, true}, {64 << 20, false}} {
		t.Run(fmt.Sprint(tc.maxBytes), func(t *testing.T) {
			cfg := testConfig(t, input, 2, 1, "colocated")
			cfg.Recalibrate = -1
			cfg.QuarantineDir = t.TempDir()
			cfg.Pipeline.Image.Size = 128 // 96 KiB a sample, 768 KiB a step of 8
			cfg.StreamMaxBytes = tc.maxBytes
			var logs lockedBuffer
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			r := start(t, cfg)
			// Without trainers the small stream fills and publishing stops, but the
			// service still encodes the steps it may queue; the large one takes all.
			checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
				if l := logs.String(); !strings.Contains(l, "fewer than two steps") && !strings.Contains(l, "every batch published") {
					return errorf("neither warned nor published everything yet")
				}
				return nil
			})
			_ = r.stop(t)
			if got := strings.Contains(logs.String(), "fewer than two steps"); got != tc.warn {
				t.Errorf("warned %v, want %v; log:\n%s", got, tc.warn, logs.String())
			}
		})
	}
}
