package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/reportcheck"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/loader/synth"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
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

// getPage returns the body of a GET of path from h.
func getPage(t *testing.T, h http.Handler, path string) string {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
	if w.Code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, w.Code, w.Body)
	}
	return w.Body.String()
}

// checkMixtureHTML checks that page shows each mixture source's line (its
// name, share, samples, draws, tokens and cost per step) with the numbers
// of the JSON report js, and that every numbered value of the page matches.
func checkMixtureHTML(t *testing.T, what, page string, js []byte) {
	t.Helper()
	n, err := reportcheck.Compare(page, js)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	var r struct{ Mixture *pipeline.MixtureReport }
	if err := json.Unmarshal(js, &r); err != nil || r.Mixture == nil {
		t.Fatalf("%s: the JSON has no mixture (%v)", what, err)
	}
	vals := reportcheck.Values(page)
	for i, s := range r.Mixture.Sources {
		for _, f := range []string{"weight", "want_share", "share", "samples", "draws", "samples_per_step", "text_tokens_per_step", "image_tokens_per_step", "cost_per_step"} {
			if _, ok := vals[fmt.Sprintf("mixture.sources.%d.%s", i, f)]; !ok {
				t.Errorf("%s: source %s shows no %s (%d numbers checked)", what, s.Name, f, n)
			}
		}
		if !strings.Contains(page, "<td>"+s.Name+"</td>") {
			t.Errorf("%s: no line names source %s", what, s.Name)
		}
	}
}

// TestServeMixture serves a 6:3:1 mixture whose small sources repeat
// samples, through the workers' path (ids looked up by draw id), to two
// trainer ranks (role all, and a planner whose items a worker builds); one crashes mid-epoch and resumes from a checkpoint two
// steps behind its acks. Every rank gets exactly the rows `shard` writes for
// the same mixture and epoch, and every planned draw, repetitions included,
// is applied exactly once. The live page and the --report-out pages show
// the per-source lines of /v1/report's and the file's "mixture".
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
	cfg.ReportOut = t.TempDir()
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
	// The live figures settle once the service has stopped: before, a
	// trainer's last feedback could land between the snapshot and the page.
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	rep := r.s.snapshot() // the /v1/report object
	if rep == nil || rep.Mixture == nil || len(rep.Mixture.Sources) != 3 || rep.Mixture.Sources[1].Name != "coco" || rep.Mixture.Planned == 0 {
		t.Fatalf("/v1/report has no per-source lines of the mixture: %+v", rep)
	}
	js, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	checkMixtureHTML(t, "GET /", getPage(t, r.s.Handler(), "/"), js)
	for _, base := range []string{"report-latest", "report-e0"} {
		page, err1 := os.ReadFile(filepath.Join(cfg.ReportOut, base+".html"))
		js, err2 := os.ReadFile(filepath.Join(cfg.ReportOut, base+".json"))
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		checkMixtureHTML(t, "--report-out "+base, string(page), js)
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

// TestShardMixtureEpochsWithWorkers: `shard --mixture --epochs 2 --nats`
// writes the files a local run writes, byte for byte: the later epoch's new
// draws (samples the first epoch did not draw, and repetitions), stored in
// extra.arrow, are built by a worker from their draw ids too.
func TestShardMixtureEpochsWithWorkers(t *testing.T) {
	pc := testConfig(t, "", 2, 1, "colocated").Pipeline
	pc.Mixture = &loader.Mixture{Sources: []loader.MixtureSource{
		{Name: "web", Path: corpus(t, 60), Weight: 6},
		{Name: "coco", Path: mixtureCorpus(t, 10, "wds", 8), Weight: 3},
		{Name: "own", Path: mixtureCorpus(t, 40, "jsonl", 9), Weight: 1, Cap: 8},
	}}
	o := pipeline.DefaultShardOptions()
	o.Epochs = 2
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	localDir, _, _ := shardLocal(t, ctx, pc, o, nil)
	ns := embeddedNATS(t)
	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	werr := make(chan error, 1)
	go func() {
		werr <- work.RunWorker(wctx, work.WorkerConfig{NATS: natsenv.Config{URLs: []string{ns.ClientURL()}}, Slots: 1, CacheDir: t.TempDir(), Logger: testLogger(t)})
	}()
	remoteDir, _, _ := shardLocal(t, ctx, pc, o, func(prep *pipeline.Prepared) pipeline.StepSource {
		sw, err := work.NewShardWorkers(ctx, work.ShardWorkConfig{NATS: natsenv.Config{URLs: []string{ns.ClientURL()}}, Logger: testLogger(t)}, prep)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sw.Close() })
		return sw.Run
	})
	stopWorkers()
	if err := <-werr; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("worker: %v", err)
	}
	local, remote := readTree(t, localDir), readTree(t, remoteDir)
	if len(local) != len(remote) {
		t.Errorf("%d files locally, %d with the workers", len(local), len(remote))
	}
	for name, b := range local {
		if !bytes.Equal(b, remote[name]) {
			t.Errorf("%s: differs (%d bytes local, %d with workers)", name, len(b), len(remote[name]))
		}
	}
}
