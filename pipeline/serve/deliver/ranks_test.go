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
	for _, tt := range []struct {
		rank int
		wake bool
	}{{0, false}, {1, false}, {2, true}, {2, false}, {0, false}, {1, true}} {
		tab.mu.Lock()
		ch := tab.moved
		at := tab.ranks[tt.rank].cursor
		tab.mu.Unlock()
		tab.StepPublished(tt.rank, at, 0)
		if got := closed(ch); got != tt.wake {
			t.Errorf("rank %d moved past %v: woken %v, want %v", tt.rank, at, got, tt.wake)
		}
	}
	if err := tab.WaitTurn(context.Background(), proto.Pos{Epoch: 0, Step: 1}); err != nil {
		t.Fatal(err)
	}
}

// TestCheckAck: on the core data plane an ack moves a rank only over
// batches handed to it; a duplicate of a completed step is accepted
// (clients send recent acks again after a reconnect).
func TestCheckAck(t *testing.T) {
	key := func(step, mb int) proto.BatchKey { return proto.BatchKey{Job: "ctl", Step: step, MicroBatch: mb} }
	tests := []struct {
		name   string
		next   proto.Pos
		handed *proto.BatchKey
		ack    proto.BatchKey
		ok     bool
	}{
		{"nothing handed", proto.Pos{Epoch: 0, Step: 0}, nil, key(0, 1), false},
		{"the last batch of the epoch, nothing handed", proto.Pos{Epoch: 0, Step: 0}, nil, key(9, 1), false},
		{"handed, at the next step", proto.Pos{Epoch: 0, Step: 0}, &proto.BatchKey{Step: 0, MicroBatch: 1}, key(0, 1), true},
		{"the first micro-batch handed, the last not", proto.Pos{Epoch: 0, Step: 0}, &proto.BatchKey{Step: 0, MicroBatch: 0}, key(0, 1), false},
		{"handed, steps ahead of the next (cumulative)", proto.Pos{Epoch: 0, Step: 0}, &proto.BatchKey{Step: 3, MicroBatch: 1}, key(2, 1), true},
		{"a step after the last handed", proto.Pos{Epoch: 0, Step: 0}, &proto.BatchKey{Step: 3, MicroBatch: 1}, key(4, 0), false},
		{"the micro-batch after the last handed", proto.Pos{Epoch: 0, Step: 3}, &proto.BatchKey{Step: 3, MicroBatch: 0}, key(3, 1), false},
		{"a later step handed, this one acked in order", proto.Pos{Epoch: 0, Step: 2}, &proto.BatchKey{Step: 3, MicroBatch: 1}, key(2, 1), true},
		{"a duplicate of a completed step", proto.Pos{Epoch: 0, Step: 5}, &proto.BatchKey{Step: 5, MicroBatch: 0}, key(3, 1), true},
		{"a duplicate, nothing handed since a restart", proto.Pos{Epoch: 0, Step: 5}, nil, key(4, 1), true},
		{"outside the plan's micro-batches", proto.Pos{Epoch: 0, Step: 0}, &proto.BatchKey{Step: 3, MicroBatch: 1}, key(0, 2), false},
		{"outside the epoch's steps", proto.Pos{Epoch: 0, Step: 0}, &proto.BatchKey{Step: 3, MicroBatch: 1}, key(10, 0), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			book := epochs.NewBook(nil, nil)
			book.SetInfo(0, epochs.Info{Steps: 10})
			tab := NewRanks(2, 1, book, nil)
			tab.Set(0, NewRankState(proto.Pos{Epoch: 0, Step: 10}, tt.next))
			if tt.handed != nil { // no bucket: in memory only
				if err := tab.Hand(context.Background(), 0, *tt.handed); err != nil {
					t.Fatal(err)
				}
			}
			if err := tab.CheckAck(0, tt.ack, 2); (err == nil) != tt.ok {
				t.Errorf("CheckAck(%v) with next %+v, handed %v: %v, want ok=%v", tt.ack, tt.next, tt.handed, err, tt.ok)
			}
		})
	}
}
