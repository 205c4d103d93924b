package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/proto"
)

// fakeDelivery is a data plane that holds rank 0's batches from held on,
// and a publish loop that records the rewinds asked of it.
type fakeDelivery struct {
	held    proto.Pos
	holding bool
	rewinds []proto.Pos
}

func (f *fakeDelivery) FirstHeld(context.Context, int) (proto.ChunkHeader, bool, error) {
	return proto.ChunkHeader{BatchKey: proto.BatchKey{Epoch: f.held.Epoch, Step: f.held.Step}}, f.holding, nil
}

func (f *fakeDelivery) Rewind(_ context.Context, _ int, to proto.Pos, _ string, done chan error) error {
	f.rewinds = append(f.rewinds, to)
	if done != nil {
		done <- nil
	}
	return nil
}

func (f *fakeDelivery) FillRegisterReply(*proto.RegisterReply, int, int) {}
func (f *fakeDelivery) TrainerReplaced(context.Context, int) error       { return nil }
func (f *fakeDelivery) DecideResize(context.Context, int, int) error     { return nil }
func (f *fakeDelivery) Poke()                                            {}

// fakeRanks is the ranks' positions, in memory.
type fakeRanks struct {
	mu           sync.Mutex
	cursor, next []proto.Pos
	conn         []string
	epochs       *epochs.Book
}

func (f *fakeRanks) Cursor(r int) proto.Pos { f.mu.Lock(); defer f.mu.Unlock(); return f.cursor[r] }
func (f *fakeRanks) Next(r int) proto.Pos   { f.mu.Lock(); defer f.mu.Unlock(); return f.next[r] }
func (f *fakeRanks) Gen(int) int            { return 0 }

func (f *fakeRanks) SwapConn(r int, conn string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	same := conn != "" && f.conn[r] == conn
	f.conn[r] = conn
	return same
}

func (f *fakeRanks) SetNext(r int, next proto.Pos, force bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	next = f.epochs.Norm(next)
	if !force && !f.next[r].Less(next) {
		return false
	}
	f.next[r] = next
	return true
}

// fakeMetrics counts what it is told, by kind and result (or reason).
type fakeMetrics struct {
	mu      sync.Mutex
	control map[[2]string]int
	refused map[[2]string]int
}

func newFakeMetrics() *fakeMetrics {
	return &fakeMetrics{control: map[[2]string]int{}, refused: map[[2]string]int{}}
}

func (m *fakeMetrics) Control(kind, result string) {
	m.mu.Lock()
	m.control[[2]string{kind, result}]++
	m.mu.Unlock()
}

func (m *fakeMetrics) ReplyRefused(kind, reason string) {
	m.mu.Lock()
	m.refused[[2]string{kind, reason}]++
	m.mu.Unlock()
}

func (m *fakeMetrics) Feedback(proto.Feedback) {}

// refusedReplies is how many replies of kind were refused, for any reason.
func (m *fakeMetrics) refusedReplies(kind string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, v := range m.refused {
		if k[0] == kind {
			n += v
		}
	}
	return n
}

// newTestControl is control over one epoch of steps steps, two ranks, no
// NATS: what it decides comes from its parts and the fake data plane.
func newTestControl(t *testing.T, steps int, cursor proto.Pos, d *fakeDelivery) *Control {
	t.Helper()
	book := epochs.NewBook(nil, nil)
	book.SetInfo(0, epochs.Info{Steps: steps})
	ranks := &fakeRanks{cursor: []proto.Pos{cursor, cursor}, next: make([]proto.Pos, 2), conn: make([]string, 2), epochs: book}
	log := slog.New(slog.DiscardHandler)
	met := newFakeMetrics()
	rlog := NewRateLog(log)
	cfg := Config{Job: "ctl", Layout: proto.Layout{DP: 2, MP: 1, PP: 1, Placement: "colocated"}, RegisterWait: time.Second}
	return New(cfg, Parts{Log: log, RateLog: rlog, Metrics: met, Replies: NewGuard(cfg.Job, 2, 1, met, rlog),
		Ranks: ranks, Epochs: book, Plane: d, Delivery: d})
}

// TestResendMovesOnlyToUnacknowledged: a resend moves a rank back to its
// first unacknowledged step (what the data plane still holds, else the
// publish cursor) whatever step it names, and a resend of an acknowledged
// step is refused, so a forged resend can neither drop held batches nor
// deliver acknowledged ones twice.
func TestResendMovesOnlyToUnacknowledged(t *testing.T) {
	for _, tc := range []struct {
		name    string
		held    proto.Pos
		holding bool
		cursor  proto.Pos
		asked   proto.Pos
		want    proto.Pos
		refused bool
	}{
		{name: "held from step 3, asked 7", held: proto.Pos{Epoch: 0, Step: 3}, holding: true, cursor: proto.Pos{Epoch: 0, Step: 8}, asked: proto.Pos{Epoch: 0, Step: 7}, want: proto.Pos{Epoch: 0, Step: 3}},
		{name: "held from step 3, asked 3", held: proto.Pos{Epoch: 0, Step: 3}, holding: true, cursor: proto.Pos{Epoch: 0, Step: 8}, asked: proto.Pos{Epoch: 0, Step: 3}, want: proto.Pos{Epoch: 0, Step: 3}},
		{name: "held from step 3, asked 2 (acknowledged)", held: proto.Pos{Epoch: 0, Step: 3}, holding: true, cursor: proto.Pos{Epoch: 0, Step: 8}, asked: proto.Pos{Epoch: 0, Step: 2}, refused: true},
		{name: "nothing held: the cursor bounds it", cursor: proto.Pos{Epoch: 0, Step: 5}, asked: proto.Pos{Epoch: 0, Step: 6}, want: proto.Pos{Epoch: 0, Step: 5}},
		{name: "nothing held, asked before the cursor", cursor: proto.Pos{Epoch: 0, Step: 5}, asked: proto.Pos{Epoch: 0, Step: 4}, refused: true},
		{name: "end of the epoch normalised", cursor: proto.Pos{Epoch: 0, Step: 10}, asked: proto.Pos{Epoch: 1, Step: 0}, want: proto.Pos{Epoch: 1, Step: 0}},
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
	c := newTestControl(t, 10, proto.Pos{}, &fakeDelivery{})
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
		r, err := c.CheckRank(tc.job, tc.dp, tc.mp)
		if !errors.Is(err, tc.err) || (tc.err == nil && r != tc.rank) {
			t.Errorf("CheckRank(%q, %d, %d) = %d, %v; want %d, %v", tc.job, tc.dp, tc.mp, r, err, tc.rank, tc.err)
		}
	}
}

// TestRegisterResumesFromTheCheckpoint: a register whose resume step the
// data plane no longer holds (the rank acknowledged batches its checkpoint
// lacks) rewinds the rank to it before the reply; one within what is held
// moves the rank there without a rewind. Either way the rank's next step is
// the resume step, even backwards.
func TestRegisterResumesFromTheCheckpoint(t *testing.T) {
	for _, tc := range []struct {
		name   string
		resume int
		rewind bool
	}{
		{"acknowledged past the checkpoint", 1, true},
		{"held from the checkpoint on", 3, false},
		{"ahead of what is held", 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &fakeDelivery{held: proto.Pos{Epoch: 0, Step: 3}, holding: true}
			c := newTestControl(t, 10, proto.Pos{Epoch: 0, Step: 8}, d)
			c.ranks.SetNext(0, proto.Pos{Epoch: 0, Step: 6}, false)
			l := c.cfg.Layout
			b, err := proto.EncodeControl(proto.Register{Job: "ctl", DP: l.DP, MP: l.MP, Placement: l.Placement, ResumeStep: tc.resume})
			if err != nil {
				t.Fatal(err)
			}
			rep := c.register(context.Background(), b, "_INBOX.mmfeed.ctl.0.0")
			if !rep.OK || rep.Steps != 10 {
				t.Fatalf("register: %+v, want ok with the epoch's 10 steps", rep)
			}
			want := proto.Pos{Epoch: 0, Step: tc.resume}
			if rewound := len(d.rewinds) == 1 && d.rewinds[0] == want; rewound != tc.rewind || len(d.rewinds) > 1 {
				t.Errorf("rewinds %v, want a rewind to %v: %v", d.rewinds, want, tc.rewind)
			}
			if got := c.ranks.Next(0); got != want {
				t.Errorf("rank 0 next %v after the register, want %v", got, want)
			}
		})
	}
}

// TestRefusalCode: what a trainer does after a refused register follows
// from the error's kind.
func TestRefusalCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("planning: %w", epochs.ErrNotReady), proto.RefusedNotReady},
		{fmt.Errorf("past the end: %w", ErrEpochRange), proto.RefusedEnd},
		{fmt.Errorf("bad: %w", proto.ErrControl), proto.RefusedInvalid},
		{fmt.Errorf("layout: %w", proto.ErrLayout), proto.RefusedInvalid},
		{errors.New("stream unavailable"), proto.RefusedFailed},
	} {
		if got := refusalCode(tc.err); got != tc.want {
			t.Errorf("refusalCode(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
