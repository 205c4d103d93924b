package serve

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/imgproc"
)

// Under --augment the workers build a later epoch's payloads with that
// epoch's crops: byte for byte those of --role all, and not those of the
// unaugmented job. Dynamic resolution, so the planner prices each crop and
// the workers' rows must carry exactly the planned image tokens.
func TestAugmentedPayloadsEqualRoleAll(t *testing.T) {
	input := corpus(t, 48)
	const epoch = 1
	fetch := func(role string, aug imgproc.Augment) (out [][]byte) {
		cfg := testConfig(t, input, 1, 1, "colocated")
		cfg.Recalibrate, cfg.Role, cfg.Pipeline.Plan.Epoch = -1, role, epoch // a worker's dataset has no epoch (0)
		cfg.Pipeline.Image.Policy = imgproc.PolicyDynamic
		cfg.Pipeline.Image.MinPixels, cfg.Pipeline.Image.MaxPixels = 16*16, 64*64
		cfg.Pipeline.Image.Augment = aug
		if role == RolePlanner {
			cfg.LocalWorkers = 1
		}
		r := start(t, cfg)
		defer r.stop(t)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		tr := newTrainer(t, cfg, r.s.ClientURL(), 0, 0)
		if err := tr.connect(ctx); err != nil {
			t.Fatal(err)
		}
		defer tr.crash()
		if rep, err := tr.register(ctx, epoch, 0); err != nil || !rep.OK {
			t.Fatalf("register: %+v, %v", rep, err)
		}
		rank := newRawRank(t, r.s.ClientURL(), cfg.Job, 0)
		for step := range 2 {
			for mb := range 2 {
				_, p := rank.fetch(epoch, step, mb)
				out = append(out, p)
			}
		}
		return out
	}
	aug := imgproc.Augment{RRC: true, Scale: imgproc.DefaultScale, Ratio: imgproc.DefaultRatio, FlipP: 0.5, Seed: 3}
	all := fetch(RoleAll, aug)
	workers := fetch(RolePlanner, aug)
	plain := fetch(RoleAll, imgproc.Augment{})
	same := 0
	for i := range all {
		if !bytes.Equal(workers[i], all[i]) {
			t.Errorf("batch %d: the workers' %d bytes differ from role all's %d", i, len(workers[i]), len(all[i]))
		}
		if bytes.Equal(all[i], plain[i]) {
			same++
		}
	}
	if same == len(all) {
		t.Error("the augmented payloads equal the unaugmented ones")
	}
}
