package deliver

import (
	"context"
	"errors"
	"testing"

	"github.com/mmfeed/mmfeed/proto"
)

// rewindLog is RewindParts that records what a rewind asked of it.
type rewindLog struct {
	dropErr  error
	dropped  []int
	rewound  []int // the generations applied
	failures []error
}

func (l *rewindLog) Drop(_ context.Context, rank int) error {
	l.dropped = append(l.dropped, rank)
	return l.dropErr
}

func (l *rewindLog) Rewound(_ Rewind, gen int) { l.rewound = append(l.rewound, gen) }

func (l *rewindLog) RewindFailed(_ Rewind, err error) { l.failures = append(l.failures, err) }

// TestRequestStopsTheRunAndTheNext: a rewind asked during a run cancels it
// and wakes the loop, and no run starts while it is queued; once the loop
// applied it (Drain), one does.
func TestRequestStopsTheRunAndTheNext(t *testing.T) {
	p := NewPublisher()
	ctx := context.Background()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !p.StartRun(cancel) {
		t.Fatal("a run did not start with no rewind queued")
	}
	if err := p.Request(ctx, Rewind{Rank: 0}); err != nil {
		t.Fatal(err)
	}
	if rctx.Err() == nil {
		t.Error("the run in progress was not cancelled")
	}
	select {
	case <-p.Woken():
	default:
		t.Error("the loop was not woken")
	}
	p.EndRun()
	if p.StartRun(func() {}) {
		t.Fatal("a run started while a rewind was queued")
	}
	if err := p.Drain(ctx, NewRanks(1, 1, nil, newMemStore()), &rewindLog{}); err != nil {
		t.Fatal(err)
	}
	if !p.StartRun(func() {}) {
		t.Error("no run started after the rewinds were applied")
	}
}

// TestApplyRewind: a rewind to where the rank's cursor has not reached
// changes nothing; one to a published step drops what the plane holds for
// the rank and moves it to the next generation at that step; a drop that
// fails moves nothing. Done gets the outcome each time.
func TestApplyRewind(t *testing.T) {
	ctx := context.Background()
	st := newMemStore()
	tab := NewRanks(2, 1, nil, st)
	at := proto.Pos{Epoch: 0, Step: 5}
	tab.Set(1, tab.Get(1).WithCursor(at))
	p := NewPublisher()
	done := make(chan error, 1)

	parts := &rewindLog{}
	p.Apply(ctx, Rewind{Rank: 1, To: proto.Pos{Epoch: 0, Step: 6}, Done: done}, tab, parts)
	if err := <-done; err != nil || len(parts.dropped) > 0 || tab.Gen(1) != 0 || tab.Cursor(1) != at {
		t.Errorf("rewind ahead of the cursor: err %v, dropped %v, gen %d, cursor %v; want nothing moved", err, parts.dropped, tab.Gen(1), tab.Cursor(1))
	}

	to := proto.Pos{Epoch: 0, Step: 2}
	p.Apply(ctx, Rewind{Rank: 1, To: to, Done: done}, tab, parts)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(parts.dropped) != 1 || parts.dropped[0] != 1 || tab.Gen(1) != 1 || tab.Cursor(1) != to || len(parts.rewound) != 1 || parts.rewound[0] != 1 {
		t.Errorf("rewind: dropped %v, gen %d, cursor %v, recorded %v; want rank 1 dropped, generation 1 at %v", parts.dropped, tab.Gen(1), tab.Cursor(1), parts.rewound, to)
	}
	if g, ok, _ := st.GetInt(ctx, RankGenKey(1, 0)); !ok || g != 1 {
		t.Errorf("KV generation %d (%v), want 1", g, ok)
	}

	failing := &rewindLog{dropErr: errors.New("purge failed")}
	p.Apply(ctx, Rewind{Rank: 1, To: proto.Pos{}, Done: done}, tab, failing)
	if err := <-done; !errors.Is(err, failing.dropErr) || len(failing.failures) != 1 || len(failing.rewound) > 0 || tab.Gen(1) != 1 || tab.Cursor(1) != to {
		t.Errorf("failed drop: err %v, failures %v, gen %d, cursor %v; want the error and nothing moved", err, failing.failures, tab.Gen(1), tab.Cursor(1))
	}
}

// TestRecalibrationDue: due every n counted steps, and a due step that finds
// the epoch not planned whole keeps counting until one does.
func TestRecalibrationDue(t *testing.T) {
	p := NewPublisher()
	planned := true
	isPlanned := func() bool { return planned }
	var got []bool
	for i := range 7 {
		planned = i != 2
		got = append(got, p.RecalibrationDue(3, isPlanned))
	}
	want := []bool{false, false, false, true, false, false, true}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("due at steps %v, want %v", got, want)
		}
	}
}

// TestFinishOnce: Finish is news once; Finished stays true.
func TestFinishOnce(t *testing.T) {
	p := NewPublisher()
	if p.Finished() {
		t.Fatal("finished before Finish")
	}
	if !p.Finish() || p.Finish() || !p.Finished() {
		t.Error("Finish is news exactly once and Finished then holds")
	}
}
