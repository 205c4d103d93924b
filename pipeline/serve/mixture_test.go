package serve

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/loader/synth"
)

// mixtureCorpus generates a corpus of n samples in format with seed.
func mixtureCorpus(t testing.TB, n int, format string, seed uint64) string {
	t.Helper()
	cfg := synth.DefaultConfig()
	cfg.Out, cfg.Samples, cfg.Seed, cfg.Format = t.TempDir(), n, seed, format
	sum, err := synth.Generate(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return sum.Path
}

// TestServeMixture serves a 6:3:1 mixture whose small sources repeat
// samples, through the workers' path (ids looked up by draw id), to two
// trainer ranks (role all, and a planner whose items a worker builds); one crashes mid-epoch and resumes from a checkpoint two
// steps behind its acks. Every rank gets exactly the rows `shard` writes for
// the same mixture and epoch, and every planned draw, repetitions included,
// is applied exactly once.
func TestServeMixture(t *testing.T) {
	for _, role := range []string{RoleAll, RolePlanner} {
		t.Run(role, func(t *testing.T) { testServeMixture(t, role) })
	}
}

func testServeMixture(t *testing.T, role string) {
	cfg := testConfig(t, "", 2, 1, "colocated")
	if cfg.Role = role; role == RolePlanner {
		cfg.LocalWorkers = 1 // the workers' path: items name draws by id
	}
	cfg.Pipeline.Mixture = &loader.Mixture{Sources: []loader.MixtureSource{
		{Name: "web", Path: corpus(t, 60), Weight: 6},
		{Name: "coco", Path: mixtureCorpus(t, 20, "wds", 8), Weight: 3},
		{Name: "own", Path: mixtureCorpus(t, 6, "jsonl", 9), Weight: 1},
	}}
	cfg.Recalibrate = -1
	cfg.QuarantineDir = t.TempDir()
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	trs := []*trainer{newTrainer(t, cfg, r.s.ClientURL(), 0, 0), newTrainer(t, cfg, r.s.ClientURL(), 1, 0)}
	var wg sync.WaitGroup
	errs := make([]error, len(trs))
	for i, tr := range trs {
		wg.Go(func() {
			if i == 1 {
				if errs[i] = tr.runEpoch(ctx, 0, 3); errs[i] != nil {
					return
				}
				tr.crash()
				tr.forget(0, tr.resumeStep(0)-2)
			}
			errs[i] = tr.runEpoch(ctx, 0, -1)
			tr.crash()
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("trainer %d: %v", i, err)
		}
	}
	rep := r.s.snapshot() // the /v1/report object
	if rep == nil || rep.Mixture == nil || len(rep.Mixture.Sources) != 3 || rep.Mixture.Sources[1].Name != "coco" || rep.Mixture.Planned == 0 {
		t.Fatalf("/v1/report has no per-source lines of the mixture: %+v", rep)
	}
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	count := map[string]int{}
	for _, tr := range trs {
		for k, rows := range tr.applied {
			for _, row := range rows {
				if k.Epoch == 0 && row.Weight > 0 {
					count[row.ID]++
				}
			}
		}
	}
	planned, repeats := 0, 0
	for _, st := range ex.plan.Steps {
		for _, rk := range st.Ranks {
			for _, mb := range rk {
				for _, e := range mb {
					if e.Weight > 0 {
						planned++
					}
				}
			}
		}
	}
	for id, n := range count {
		if n != 1 {
			t.Errorf("draw %s applied %d times", id, n)
		}
		if _, _, ok := loader.DrawBase(id); ok && !strings.HasPrefix(id, "web/") {
			repeats++
		}
	}
	if len(count) != planned {
		t.Errorf("%d distinct draws applied, want the plan's %d", len(count), planned)
	}
	if repeats == 0 {
		t.Error("no repeated draw was applied: the test checks no repetition")
	}
}
