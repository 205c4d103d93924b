package serve

import (
	"context"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// TestRegisterRefusalCodes: a trainer can tell "not yet" (the epoch is still
// being planned: register again) from "done" (the job has no such epoch:
// the end of the data) and from a wrong register. Before the codes, every
// refusal read as the end of the data and the trainer exited after epoch 0.
func TestRegisterRefusalCodes(t *testing.T) {
	cfg := testConfig(t, corpus(t, 40), 2, 1, "colocated")
	cfg.Epochs = 3
	cfg.RegisterWait = time.Millisecond // epoch 2 is not planned while nobody consumes epoch 0
	cfg.StreamMaxBytes = 64 << 10
	r := start(t, cfg)
	tr := newTrainer(t, cfg, r.s.ClientURL(), 0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tr.connect(ctx); err != nil {
		t.Fatal(err)
	}
	defer tr.crash()
	good := proto.Register{Job: cfg.Job, DPRank: 0, MPRank: 0, DP: 2, MP: 1, Placement: "colocated"}
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error { // epoch 0 gets planned
		rep, err := registerWith(ctx, tr.nc, cfg.Job, good)
		if err == nil && !rep.OK {
			err = errorf("%s: %s", rep.Code, rep.Error)
		}
		return err
	})
	tests := []struct {
		name string
		edit func(*proto.Register)
		want string
	}{
		{"planned", func(*proto.Register) {}, ""},
		{"before the first epoch", func(r *proto.Register) { r.Epoch = -1 }, proto.RefusedInvalid},
		{"still planning", func(r *proto.Register) { r.Epoch = 2 }, proto.RefusedNotReady},
		{"past the last epoch", func(r *proto.Register) { r.Epoch = 3 }, proto.RefusedEnd},
		{"wrong layout", func(r *proto.Register) { r.DP = 4 }, proto.RefusedInvalid},
		{"wrong resume step", func(r *proto.Register) { r.ResumeStep = 1000 }, proto.RefusedInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := good
			tc.edit(&reg)
			rep, err := registerWith(ctx, tr.nc, cfg.Job, reg)
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK != (tc.want == "") || rep.Code != tc.want {
				t.Errorf("got ok=%v code %q (%s), want code %q", rep.OK, rep.Code, rep.Error, tc.want)
			}
		})
	}
}
