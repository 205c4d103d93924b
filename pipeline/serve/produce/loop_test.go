package produce

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/proto"
)

// book is an epoch book with no plan: positions are not normalised, and
// the loop must not need a plan (every cursor is past the job's end).
type book struct{ waited int }

func (b *book) Epoch(context.Context, int) (*epochs.Plan, error) {
	return nil, errors.New("no epoch to publish")
}
func (b *book) Plan(int) *epochs.Plan { return nil }
func (b *book) PlanFrom(*epochs.Plan, int) (*balancer.Plan, int, bool) {
	return nil, 0, false
}
func (b *book) Norm(p proto.Pos) proto.Pos                   { return p }
func (b *book) StepBefore(p proto.Pos) (proto.Pos, bool)     { return p, false }
func (b *book) PlanAhead(context.Context, int, *slog.Logger) {}
func (b *book) WaitBackground()                              { b.waited++ }
func (b *book) PlanAheadDue(*epochs.Plan, int, int, int, time.Duration) bool {
	return false
}

// service records what the loop asks of the Service.
type service struct {
	mu       sync.Mutex
	resized  int
	finished []int
}

func (s *service) AwaitResize(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resized++
	return nil
}

func (s *service) RecalibrateDue(context.Context, *epochs.Plan, int, []proto.Pos) bool { return false }

func (s *service) RecordFinished(_ context.Context, last int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finished = append(s.finished, last)
	return nil
}

func (s *service) records() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.finished...)
}

// done makes a Producer of a job of epochs 0..last over ranks whose
// cursors are all past the end and whose trainers need next.
func done(t *testing.T, last int, next proto.Pos, wait bool) (*Producer, *book, *service, *deliver.Publisher, *bytes.Buffer) {
	t.Helper()
	b, svc, pub := &book{}, &service{}, deliver.NewPublisher()
	ranks := deliver.NewRanks(4, 2, b, nil)
	for r := range ranks.Len() {
		ranks.Set(r, deliver.NewRankState(proto.Pos{Epoch: last + 1}, next))
	}
	var logs bytes.Buffer
	p := New(Config{Job: "j", MP: 2, LastEpoch: last, Epochs: last + 1, MicroBatches: 1, StreamMaxBytes: 1000, WaitForTrainers: wait},
		Parts{Log: slog.New(slog.NewTextHandler(&logs, nil)), Epochs: b, Ranks: ranks, Publisher: pub, Service: svc})
	return p, b, svc, pub, &logs
}

// Once every cursor is past the job's last epoch and every trainer needs
// nothing more, Run records the job finished once and returns, after the
// resize wait and with the plan-ahead waited for.
func TestRunEndsOnceEverythingIsPublishedAndTrained(t *testing.T) {
	p, b, svc, pub, logs := done(t, 2, proto.Pos{Epoch: 3}, true)
	if err := p.Run(context.Background()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := svc.records(); len(got) != 1 || got[0] != 2 {
		t.Errorf("finished records %v, want one of the last epoch 2", got)
	}
	if svc.resized != 1 || b.waited != 1 || !pub.Finished() {
		t.Errorf("resize waits %d, plan-ahead waits %d, finished %v: want 1, 1, true", svc.resized, b.waited, pub.Finished())
	}
	if n := strings.Count(logs.String(), "every batch published"); n != 1 {
		t.Errorf("%d 'every batch published' lines, want 1:\n%s", n, logs)
	}
}

// With WaitForTrainers, Run keeps waiting (serving wake-ups) while a
// trainer still needs a step, and records the job finished only once.
func TestRunWaitsForTheTrainers(t *testing.T) {
	p, _, svc, pub, _ := done(t, 0, proto.Pos{Epoch: 0, Step: 3}, true)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !pub.Finished() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	pub.Poke()
	pub.Poke()
	select {
	case err := <-errc:
		t.Fatalf("Run returned %v while a trainer needs a step", err)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run after cancel: %v, want context.Canceled", err)
	}
	if got := svc.records(); len(got) != 1 || got[0] != 0 {
		t.Errorf("finished records %v, want one of epoch 0", got)
	}
	p2, _, svc2, _, _ := done(t, 0, proto.Pos{Epoch: 0, Step: 3}, false)
	if err := p2.Run(context.Background()); err != nil || len(svc2.records()) != 1 {
		t.Errorf("without WaitForTrainers: Run %v, records %v; want nil and one", err, svc2.records())
	}
}

// The stream-room warning: given once, when a step of every rank (the
// bytes encoded for some ranks, scaled to all) takes more than half the
// stream.
func TestStreamRoomWarnsOnce(t *testing.T) {
	p, _, _, pub, logs := done(t, 0, proto.Pos{}, false)
	p.checkStreamRoom(0, 250, 2) // 4 ranks: 500 bytes a step, half the stream
	p.checkStreamRoom(1, 0, 0)   // no rank at the step
	if pub.RoomWarned() {
		t.Fatalf("warned for a step of half the stream:\n%s", logs)
	}
	p.checkStreamRoom(2, 251, 2)
	p.checkStreamRoom(3, 900, 2)
	if n := strings.Count(logs.String(), "the stream holds fewer than two steps"); n != 1 || !pub.RoomWarned() {
		t.Errorf("%d warnings, want 1:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "step_bytes=502") {
		t.Errorf("the warning names the scaled step bytes 502:\n%s", logs)
	}
}
