package deliver

import (
	"context"
	"testing"

	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/proto"
)

// TestStepPublishedWakesOnlyWhenTheLeastCursorMoves: the publishers wait
// (WaitTurn) for every rank's cursor, that is for the least one; a rank
// ahead of another moving on does not wake them, the last rank of a step
// does. A wake-up per cursor move woke every rank's publisher once per rank
// and step.
func TestStepPublishedWakesOnlyWhenTheLeastCursorMoves(t *testing.T) {
	tab := NewRanks(3, 1, epochs.NewBook(nil, nil), nil)
	woken := func(ch chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	for _, tt := range []struct {
		rank int
		wake bool
	}{{0, false}, {1, false}, {2, true}, {2, false}, {0, false}, {1, true}} {
		tab.mu.Lock()
		ch := tab.moved
		at := tab.ranks[tt.rank].cursor
		tab.mu.Unlock()
		tab.StepPublished(tt.rank, at, 0)
		if got := woken(ch); got != tt.wake {
			t.Errorf("rank %d moved past %v: woken %v, want %v", tt.rank, at, got, tt.wake)
		}
	}
	if err := tab.WaitTurn(context.Background(), proto.Pos{Epoch: 0, Step: 1}); err != nil {
		t.Fatal(err)
	}
}
