package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/control"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// TestForgedControlMessages replays the attack from the reliability issue:
// anyone on the NATS port sends `done` for every rank and a `resend` for
// step 2 of rank 0 while steps 0–1 wait unconsumed in the stream. The
// service must not end the job (it checks what each rank acknowledged), the
// resend must not purge the queued steps for good (it rewinds to the first
// unacknowledged step), and the real trainers then get every batch exactly
// once.
func TestForgedControlMessages(t *testing.T) {
	t.Cleanup(control.SetDoneAckWait(100 * time.Millisecond))
	cfg := testConfig(t, corpus(t, 120), 2, 1, "colocated")
	cfg.Recalibrate = -1
	cfg.QuarantineDir = t.TempDir()
	cfg.StreamMaxBytes = 256 << 10
	r := start(t, cfg)
	checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := counter(t, r.s, "mmfeed_serve_batches_total"); n < 12 {
			return errorf("%v batches published", n)
		}
		return nil
	})
	nc, err := nats.Connect(r.s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	forge := func(kind string, v any) {
		b, err := proto.EncodeControl(v)
		if err != nil {
			t.Fatal(err)
		}
		subj, _ := proto.ControlSubject(cfg.Job, kind)
		if err := nc.Publish(subj, b); err != nil {
			t.Fatal(err)
		}
	}
	for dp := range 2 {
		forge(proto.CtlDone, proto.Done{Job: cfg.Job, Epoch: 0, DPRank: dp, Steps: 99})
		forge(proto.CtlFeedback, proto.Feedback{Job: cfg.Job, Epoch: 0, Step: 98, DPRank: dp, ComputeSeconds: 1})
	}
	forge(proto.CtlResend, proto.Resend{Job: cfg.Job, Epoch: 0, Step: 2, DPRank: 0, Reason: "forged"})
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		refused := labelled(t, r.s, "mmfeed_serve_control_messages_total", "unacknowledged")
		moved := r.s.ranks.Next(0) != (proto.Pos{}) && r.s.ranks.Next(1) != (proto.Pos{})
		if rewinds := counter(t, r.s, "mmfeed_serve_rewinds_total"); (refused < 2 && !moved) || rewinds < 1 {
			return errorf("%v dones held back, %v rewinds", refused, rewinds)
		}
		return nil
	})
	for i, rs := range r.s.ranks.All() {
		if rs.Next() != (proto.Pos{Epoch: 0, Step: 0}) {
			t.Errorf("rank %d: next needed step %+v after forged messages, want epoch 0 step 0", i, rs.Next())
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	trs := runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0})
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	realOnce(t, trs, 0, ex, len(quarantinedIDs(t, cfg.QuarantineDir, 0)))
}

// labelled returns the sum of a counter family's series that carry value
// for some label.
func labelled(t testing.TB, s *Service, name, value string) float64 {
	t.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetValue() == value {
					sum += m.Counter.GetValue()
				}
			}
		}
	}
	return sum
}

// TestControlFloodBounded: a flood of registers for an epoch still being
// planned gets at most the bound waiting (the rest refused at once with code
// "failed"), and a flood of resends for one rank is merged into the rewind in
// flight instead of one rewind (and goroutine) each.
func TestControlFloodBounded(t *testing.T) {
	cfg := testConfig(t, corpus(t, 40), 2, 1, "colocated")
	cfg.Epochs = 3
	cfg.RegisterWait = 5 * time.Second
	cfg.StreamMaxBytes = 64 << 10 // epoch 2 is not planned while nobody consumes
	r := start(t, cfg)
	nc, err := nats.Connect(r.s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	regSubj, _ := proto.ControlSubject(cfg.Job, proto.CtlRegister)
	replies := make(chan *nats.Msg, 256)
	inbox := nats.NewInbox()
	sub, err := nc.ChanSubscribe(inbox+".*", replies)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	reg, _ := proto.EncodeControl(proto.Register{Job: cfg.Job, DP: 2, MP: 1, Placement: "colocated", Epoch: 2})
	const flood = 60
	for i := range flood {
		if err := nc.PublishRequest(regSubj, fmt.Sprintf("%s.%d", inbox, i), reg); err != nil {
			t.Fatal(err)
		}
	}
	busy, bound := 0, control.MaxWaitingRegisters(2)
	deadline := time.After(4 * time.Second) // before the waiting ones time out
	for busy < flood-bound {
		select {
		case m := <-replies:
			var rep proto.RegisterReply
			if err := json.Unmarshal(m.Data, &rep); err != nil {
				t.Fatal(err)
			}
			if rep.Code == proto.RefusedFailed {
				busy++
			}
		case <-deadline:
			t.Fatalf("%d registers refused at once, want %d (%d may wait)", busy, flood-bound, bound)
		}
	}

	resSubj, _ := proto.ControlSubject(cfg.Job, proto.CtlResend)
	res, _ := proto.EncodeControl(proto.Resend{Job: cfg.Job, Epoch: 0, Step: 0, DPRank: 0, Reason: "flood"})
	for range 500 {
		if err := nc.Publish(resSubj, res); err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		ok, merged := labelled(t, r.s, "mmfeed_serve_control_messages_total", "ok"), labelled(t, r.s, "mmfeed_serve_control_messages_total", "merged")
		if ok+merged < 500 {
			return errorf("%v resends handled, %v merged", ok, merged)
		}
		return nil
	})
	// Most resends must merge into the one in flight; how many depends on how
	// fast one rewind runs, so the bound is loose.
	if merged := labelled(t, r.s, "mmfeed_serve_control_messages_total", "merged"); merged < 350 {
		t.Errorf("%v of 500 resends of one rank merged into the one in flight, want most", merged)
	}
}
