package deliver

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/mmfeed/mmfeed/proto"
)

// TestPlanesWithoutNATS: what each plane answers before it is set up: only
// the core plane names fetch and ack subjects in a register reply and serves
// a resize (the JetStream plane's refusal wraps the JobMismatch it is given),
// the core plane continues at the KV cursor, and neither reports gauges
// before its outbox exists or its stream was polled.
func TestPlanesWithoutNATS(t *testing.T) {
	mismatch := errors.New("mismatch")
	cfg := PlaneConfig{Job: "job1", Ranks: 2, MP: 1, MicroBatches: 2, MaxBytes: 1 << 20, JobMismatch: mismatch}
	core := NewCorePlane(cfg, nil, NewPublisher(), nil)
	stream := NewStreamPlane(cfg, nil, NewPublisher(), nil, nil)
	for _, tc := range []struct {
		name   string
		p      DataPlane
		isCore bool
	}{{proto.DataPlaneCore, core, true}, {proto.DataPlaneJetStream, stream, false}} {
		t.Run(tc.name, func(t *testing.T) {
			var rep proto.RegisterReply
			tc.p.FillRegisterReply(&rep, 1, 0)
			fetch, _ := proto.FetchSubject("job1", 1, 0)
			if (rep.FetchSubject == fetch) != tc.isCore || (rep.AckSubject != "") != tc.isCore {
				t.Errorf("register reply fetch %q ack %q", rep.FetchSubject, rep.AckSubject)
			}
			err := tc.p.Resizable("job1", 2, 4)
			if (err == nil) != tc.isCore || (err != nil && !errors.Is(err, mismatch)) {
				t.Errorf("resizable: %v", err)
			}
			if g := tc.p.Gauges(); g.Outbox || g.Stream != nil {
				t.Errorf("gauges before setup: %+v", g)
			}
		})
	}
	at := proto.Pos{Epoch: 1, Step: 3}
	if got, err := core.RestoredCursor(context.Background(), 1, at); err != nil || got != at {
		t.Errorf("core restored cursor %v, %v, want %v", got, err, at)
	}
}

// TestStreamGaugesAreACopy: the gauges a reader gets do not change with the
// next poll, nor does the plane's snapshot change with the reader's copy.
func TestStreamGaugesAreACopy(t *testing.T) {
	p := NewStreamPlane(PlaneConfig{Ranks: 1, MP: 1}, nil, nil, nil, nil)
	p.snap.Store(&StreamGauges{Bytes: 10, Ranks: []RankGauges{{Polled: true, Pending: 3}}})
	g := p.Gauges()
	g.Stream.Ranks[0].Pending = 99
	if again := p.Gauges(); again.Stream == nil || again.Stream.Bytes != 10 || again.Stream.Ranks[0].Pending != 3 {
		t.Errorf("gauges %+v after the reader changed its copy", again.Stream)
	}
}

// TestPermanentPublishErrors: a publish that cannot succeed by retrying (too
// large, invalid) is not retried; a lost connection is.
func TestPermanentPublishErrors(t *testing.T) {
	for _, err := range []error{proto.ErrTooLarge, proto.ErrInvalidConfig, proto.ErrInvalidMeta, proto.ErrInvalidRow, proto.ErrInvalidName, proto.ErrSchema} {
		if !permanent(fmt.Errorf("publish: %w", err)) {
			t.Errorf("%v: retried", err)
		}
	}
	if permanent(errors.New("connection lost")) {
		t.Error("a lost connection is not retried")
	}
}
