package serve

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/prometheus/client_golang/prometheus"
)

// fakeDelivery is a data plane that holds rank 0's batches from held on.
type fakeDelivery struct {
	held    pos
	holding bool
	rewinds []rewindReq
}

func (f *fakeDelivery) firstHeld(context.Context, int) (proto.ChunkHeader, bool, error) {
	return proto.ChunkHeader{BatchKey: proto.BatchKey{Epoch: f.held.Epoch, Step: f.held.Step}}, f.holding, nil
}

func (f *fakeDelivery) requestRewind(_ context.Context, req rewindReq) error {
	f.rewinds = append(f.rewinds, req)
	return nil
}

func (f *fakeDelivery) fillRegisterReply(*proto.RegisterReply, int, int) {}
func (f *fakeDelivery) trainerReplaced(context.Context, int) error       { return nil }
func (f *fakeDelivery) decideResize(context.Context, int, int) error     { return nil }

// newTestControl is control over one epoch of steps steps, two ranks, no
// NATS: what it decides comes from its parts and the fake data plane.
func newTestControl(t *testing.T, steps int, cursor pos, d *fakeDelivery) *control {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Job = "ctl"
	cfg.Pipeline.Plan.DP = 2
	epochs := epochs.NewBook(nil, nil)
	epochs.SetInfo(0, EpochInfo{Steps: steps})
	ranks := deliver.NewRanks(2, 1, epochs, kvStore{&state{}})
	for r := range 2 {
		ranks.Set(r, deliver.NewRankState(cursor, pos{Epoch: 0, Step: 0}))
	}
	s := &Service{cfg: cfg, log: slog.New(slog.DiscardHandler), epochs: epochs, ranks: ranks, publisher: newPublisher()}
	s.met = newMetrics(s)
	if err := s.met.register(prometheus.NewRegistry()); err != nil {
		t.Fatal(err)
	}
	c := newControl(s)
	c.plane, c.delivery = d, d
	return c
}

// TestResendMovesOnlyToUnacknowledged: a resend moves a rank back to its
// first unacknowledged step (what the data plane still holds, else the
// publish cursor) whatever step it names, and a resend of an acknowledged
// step is refused, so a forged resend can neither drop held batches nor
// deliver acknowledged ones twice.
func TestResendMovesOnlyToUnacknowledged(t *testing.T) {
	for _, tc := range []struct {
		name    string
		held    pos
		holding bool
		cursor  pos
		asked   pos
		want    pos
		refused bool
	}{
		{name: "held from step 3, asked 7", held: pos{Epoch: 0, Step: 3}, holding: true, cursor: pos{Epoch: 0, Step: 8}, asked: pos{Epoch: 0, Step: 7}, want: pos{Epoch: 0, Step: 3}},
		{name: "held from step 3, asked 3", held: pos{Epoch: 0, Step: 3}, holding: true, cursor: pos{Epoch: 0, Step: 8}, asked: pos{Epoch: 0, Step: 3}, want: pos{Epoch: 0, Step: 3}},
		{name: "held from step 3, asked 2 (acknowledged)", held: pos{Epoch: 0, Step: 3}, holding: true, cursor: pos{Epoch: 0, Step: 8}, asked: pos{Epoch: 0, Step: 2}, refused: true},
		{name: "nothing held: the cursor bounds it", cursor: pos{Epoch: 0, Step: 5}, asked: pos{Epoch: 0, Step: 6}, want: pos{Epoch: 0, Step: 5}},
		{name: "nothing held, asked before the cursor", cursor: pos{Epoch: 0, Step: 5}, asked: pos{Epoch: 0, Step: 4}, refused: true},
		{name: "end of the epoch normalised", cursor: pos{Epoch: 0, Step: 10}, asked: pos{Epoch: 1, Step: 0}, want: pos{Epoch: 1, Step: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &fakeDelivery{held: tc.held, holding: tc.holding}
			c := newTestControl(t, 10, tc.cursor, d)
			got, err := c.resendFrom(context.Background(), 0, tc.asked)
			if tc.refused {
				if !errors.Is(err, proto.ErrControl) {
					t.Fatalf("resendFrom(%v) = %v, %v; want refused with ErrControl", tc.asked, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("resendFrom(%v) = %v, %v; want %v", tc.asked, got, err, tc.want)
			}
		})
	}
}

// TestCheckRank refuses another job's messages and ranks outside the layout.
func TestCheckRank(t *testing.T) {
	c := newTestControl(t, 10, pos{}, &fakeDelivery{})
	for _, tc := range []struct {
		job    string
		dp, mp int
		rank   int
		err    error
	}{
		{"ctl", 1, 0, 1, nil},
		{"other", 0, 0, 0, proto.ErrControl},
		{"ctl", 2, 0, 0, proto.ErrLayout},
		{"ctl", 0, 1, 0, proto.ErrLayout},
	} {
		r, err := c.checkRank(tc.job, tc.dp, tc.mp)
		if !errors.Is(err, tc.err) || (tc.err == nil && r != tc.rank) {
			t.Errorf("checkRank(%q, %d, %d) = %d, %v; want %d, %v", tc.job, tc.dp, tc.mp, r, err, tc.rank, tc.err)
		}
	}
}
