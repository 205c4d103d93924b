package serve

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// TestResendAnswersRequests: a resend sent as a request (the Python client's,
// which retries until it is answered) gets {"ok": true} once the service has
// it, and a refusal with the reason for a rank outside the job.
func TestResendAnswersRequests(t *testing.T) {
	cfg := testConfig(t, corpus(t, 60), 2, 1, "colocated")
	cfg.Recalibrate = -1
	cfg.QuarantineDir = t.TempDir()
	r := start(t, cfg)
	nc, err := nats.Connect(r.s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	subj, _ := proto.ControlSubject(cfg.Job, proto.CtlResend)
	for _, tc := range []struct {
		name   string
		dp     int
		wantOK bool
	}{
		{"own rank", 0, true},
		{"no such rank", 7, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := proto.EncodeControl(proto.Resend{Job: cfg.Job, Epoch: 0, Step: 0, DPRank: tc.dp, Reason: "test"})
			if err != nil {
				t.Fatal(err)
			}
			m, err := nc.Request(subj, b, 10*time.Second)
			if err != nil {
				t.Fatalf("resend request unanswered: %v", err)
			}
			var rep proto.ResendReply
			if err := json.Unmarshal(m.Data, &rep); err != nil {
				t.Fatal(err)
			}
			if rep.OK != tc.wantOK || (!rep.OK && rep.Error == "") {
				t.Errorf("reply %+v, want ok %v (with a reason when refused)", rep, tc.wantOK)
			}
		})
	}
	// The resend rewound rank 0 to a new generation: its register reply names
	// it, so the Python client drops older copies from its first fetch on.
	checkFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l := cfg.layout()
		rep, err := registerWith(ctx, nc, cfg.Job, proto.Register{Job: cfg.Job, DP: l.DP, MP: l.MP, Placement: l.Placement})
		if err != nil || !rep.OK || rep.Generation < 1 {
			return errorf("register after a resend: %+v %v, want generation >= 1", rep, err)
		}
		return nil
	})
}
