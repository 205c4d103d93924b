package serve

import (
	"context"
	"errors"
	"testing"

	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/proto"
)

// TestDataPlaneChoice: New chooses the plane Config.DataPlane names, and
// what a plane answers without NATS differs as the protocol says: only the
// core plane names fetch and ack subjects in a register reply, serves a
// resize, and continues after a restart at the KV cursor.
func TestDataPlaneChoice(t *testing.T) {
	for _, tc := range []struct {
		plane     string
		core      bool
		resizable bool
	}{
		{proto.DataPlaneCore, true, true},
		{proto.DataPlaneJetStream, false, false},
	} {
		t.Run(tc.plane, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Job, cfg.DataPlane = "plane", tc.plane
			s := &Service{cfg: cfg}
			p := newDataPlane(s)
			if _, isCore := p.(*deliver.CorePlane); isCore != tc.core {
				t.Fatalf("plane %T for %q", p, tc.plane)
			}
			var rep proto.RegisterReply
			p.FillRegisterReply(&rep, 0, 0)
			if rep.DataPlane != tc.plane || (rep.FetchSubject != "") != tc.core || (rep.AckSubject != "") != tc.core {
				t.Errorf("register reply %q fetch %q ack %q", rep.DataPlane, rep.FetchSubject, rep.AckSubject)
			}
			err := p.Resizable(cfg.Job, 2, 4)
			if (err == nil) != tc.resizable || (err != nil && !errors.Is(err, ErrJobMismatch)) {
				t.Errorf("resizable: %v, want resizable=%v", err, tc.resizable)
			}
			if tc.core {
				if got, err := p.RestoredCursor(context.Background(), 0, proto.Pos{Epoch: 1, Step: 7}); err != nil || got != (proto.Pos{Epoch: 1, Step: 7}) {
					t.Errorf("restored cursor %v, %v, want the KV cursor", got, err)
				}
			}
		})
	}
}
