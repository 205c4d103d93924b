package deliver

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/proto"
)

// holdLog is RankParts that records the micro-batches handed to it.
type holdLog struct {
	err     error
	held    []proto.BatchKey
	samples int
}

func (h *holdLog) Hold(_ context.Context, _ int, m Out, _ time.Time) error {
	if h.err != nil {
		return h.err
	}
	h.held = append(h.held, m.Key())
	return nil
}

func (h *holdLog) Published(_, samples int) { h.samples += samples }

// TestQueueOutCountsOnModelRankZero: a micro-batch's real samples are its
// rows of positive weight, counted on mp rank 0 only (each dp rank's rows
// reach every mp rank); a full queue gives up with ctx.
func TestQueueOutCountsOnModelRankZero(t *testing.T) {
	ctx := context.Background()
	rows := []proto.Row{{Weight: 1}, {Weight: 0}, {Weight: 2}}
	q := make(chan Out, 2)
	for mp, want := range []int{2, 0} {
		if err := QueueOut(ctx, q, NewOut(proto.BatchKey{}, 0, nil, false), rows, mp); err != nil {
			t.Fatal(err)
		}
		if got := (<-q).Samples(); got != want {
			t.Errorf("mp %d: %d samples, want %d", mp, got, want)
		}
	}
	q = make(chan Out)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := QueueOut(cctx, q, Out{}, rows, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("full queue, ended ctx: %v, want context.Canceled", err)
	}
}

// TestPublishRankMovesTheCursorAfterTheStep: the rank's cursor moves on
// after a step's last micro-batch only, every micro-batch is counted and
// reaches the test hook, and a step waits for every rank to be at it; a
// hold that fails ends the rank's publisher without moving it.
func TestPublishRankMovesTheCursorAfterTheStep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tab := NewRanks(2, 1, epochs.NewBook(nil, nil), nil)
	p := NewPublisher()
	var built []proto.BatchKey
	p.SetBuilt(func(k proto.BatchKey) { built = append(built, k) })
	key := func(step, mb int) proto.BatchKey { return proto.BatchKey{Step: step, MicroBatch: mb} }
	q := make(chan Out, 4)
	q <- NewOut(key(0, 0), 0, []byte("a"), false)
	q <- Out{key: key(0, 1), payload: []byte("b"), samples: 3, last: true}
	q <- NewOut(key(1, 0), 0, []byte("c"), false) // waits for rank 1 at step 1
	close(q)
	parts := &holdLog{}
	done := make(chan error, 1)
	go func() { done <- PublishRank(ctx, p, 0, q, tab, parts) }()
	deadline := time.Now().Add(5 * time.Second)
	for tab.Cursor(0) != (proto.Pos{Step: 1}) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("rank 0 published step 1 before rank 1 had step 0: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	tab.StepPublished(1, proto.Pos{}, 0)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if tab.Cursor(0) != (proto.Pos{Step: 1}) {
		t.Errorf("cursor %v after step 0 and step 1's first micro-batch, want step 1", tab.Cursor(0))
	}
	if len(parts.held) != 3 || len(built) != 3 || parts.samples != 3 {
		t.Errorf("held %v, built %v, %d samples; want the 3 micro-batches and 3 samples", parts.held, built, parts.samples)
	}

	failing := &holdLog{err: errors.New("stream gone")}
	q = make(chan Out, 1)
	q <- NewOut(key(1, 0), 0, nil, true)
	close(q)
	if err := PublishRank(ctx, p, 0, q, tab, failing); !errors.Is(err, failing.err) || tab.Cursor(0) != (proto.Pos{Step: 1}) {
		t.Errorf("failed hold: %v, cursor %v; want the error and the cursor kept", err, tab.Cursor(0))
	}
}
