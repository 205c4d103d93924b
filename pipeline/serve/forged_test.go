package serve

import (
	"context"
	"testing"
	"time"

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
	old := doneAckWait
	doneAckWait = 100 * time.Millisecond
	t.Cleanup(func() { doneAckWait = old })
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
		r.s.mu.Lock()
		moved := r.s.ranks[0].next != (pos{}) && r.s.ranks[1].next != (pos{})
		r.s.mu.Unlock()
		if rewinds := counter(t, r.s, "mmfeed_serve_rewinds_total"); (refused < 2 && !moved) || rewinds < 1 {
			return errorf("%v dones held back, %v rewinds", refused, rewinds)
		}
		return nil
	})
	r.s.mu.Lock()
	for i, rs := range r.s.ranks {
		if rs.next != (pos{0, 0}) {
			t.Errorf("rank %d: next needed step %+v after forged messages, want epoch 0 step 0", i, rs.next)
		}
	}
	r.s.mu.Unlock()

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
