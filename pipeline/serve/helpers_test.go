package serve

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/loader/synth/synthtest"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/proto"
)

// corpus is synthtest.Corpus: n generated samples, 5% of them bad.
func corpus(t testing.TB, n int) string { return synthtest.Corpus(t, n) }

func testLogger(t testing.TB) *slog.Logger { return testnats.Logger(t) }

// testConfig serves input to dp × mp ranks with small images.
func testConfig(t testing.TB, input string, dp, mp int, placement string) Config {
	t.Helper()
	c := DefaultConfig()
	c.Job = "job-1"
	c.MP = mp
	c.Pipeline.Input = input
	c.Pipeline.Plan.DP, c.Pipeline.Plan.MicroBatches, c.Pipeline.Plan.GlobalBatch = dp, 2, 4*dp
	pl, err := balancer.ParsePlacement(placement)
	if err != nil {
		t.Fatal(err)
	}
	c.Pipeline.Plan.Placement = pl
	c.Pipeline.Image.Size, c.Pipeline.Image.PatchSize = 32, 16
	c.Pipeline.Workers = 2
	c.NATS.Listen = "127.0.0.1:0"
	c.NATS.DataDir = t.TempDir()
	c.StreamMaxBytes = 64 << 20
	c.Duplicates = 30 * time.Second
	c.HTTP = "127.0.0.1:0"
	c.RegisterWait = 20 * time.Second
	c.Logger = testLogger(t)
	return c
}

// running is a Service running in the background.
type running struct {
	s      *Service
	cancel context.CancelFunc
	errc   chan error
}

func start(t testing.TB, cfg Config) *running {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return startService(t, s)
}

// startService runs s in the background until the test ends.
func startService(t testing.TB, s *Service) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{s: s, cancel: cancel, errc: make(chan error, 1)}
	go func() { r.errc <- s.Run(ctx) }()
	select {
	case <-s.Ready():
	case err := <-r.errc:
		cancel()
		t.Fatalf("service ended before ready: %v", err)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("service not ready after 60s")
	}
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels the service and waits for it; a second call is a no-op.
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.errc:
		if ok {
			close(r.errc)
		}
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("service did not stop within 30s")
	}
	return nil
}

// wait waits for the service to return by itself.
func (r *running) wait(t testing.TB, d time.Duration) error {
	t.Helper()
	select {
	case err, ok := <-r.errc:
		if ok {
			close(r.errc)
		}
		return err
	case <-time.After(d):
		t.Fatalf("service still running after %v", d)
	}
	return nil
}

var checkFor = testnats.CheckFor

var freePort = testnats.FreePort

// expected is what `mmfeed shard` writes for the same input, config and epoch:
// rows by (step, dp rank, micro-batch), the plan, and samples seen.
type expected struct {
	plan  *balancer.Plan
	rows  map[[3]int][]proto.Row
	seen  int
	steps int
}

func shardExpectation(t testing.TB, cfg Config, epoch int) expected {
	t.Helper()
	pc := cfg.Pipeline
	pc.Plan.Epoch = epoch
	prep, err := pipeline.Prepare(context.Background(), pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prep.Close()
	plan, err := prep.Plan(pc.Plan.Strategy)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := pipeline.WriteShards(context.Background(), prep, plan, dir, nil); err != nil {
		t.Fatal(err)
	}
	ex := expected{plan: plan, rows: map[[3]int][]proto.Row{}, seen: int(prep.Seen()), steps: len(plan.Steps)}
	if pc.Mixture != nil { // an epoch of a mixture is its draws (docs/mixtures.md), not the samples indexed
		ex.seen = len(prep.Features.Items) + int(prep.Quarantine.Total())
	}
	for r := range pc.Plan.DP {
		f, err := os.Open(dir + "/" + pipeline.RankFile(r))
		if err != nil {
			t.Fatal(err)
		}
		rd, err := ipc.NewFileReader(f)
		if err != nil {
			t.Fatal(err)
		}
		for i := range rd.NumRecords() {
			rec, err := rd.RecordBatch(i)
			if err != nil {
				t.Fatal(err)
			}
			_, rows, err := proto.ReadRows(rec)
			if err != nil {
				t.Fatal(err)
			}
			step, mb := i/pc.Plan.MicroBatches, i%pc.Plan.MicroBatches
			ex.rows[[3]int{step, r, mb}] = cloneRows(rows)
		}
		rd.Close()
		f.Close()
	}
	return ex
}

// project keeps the columns modality m carries, as ReadRows returns them.
func project(m proto.Modality, rows []proto.Row) []proto.Row {
	out := make([]proto.Row, len(rows))
	for i, r := range rows {
		if m == proto.ModalityVision {
			r.InputIDs, r.TextTokens = nil, 0
		}
		if m == proto.ModalityText {
			r.Pixels, r.PixelShape, r.ImageTokens = nil, [3]int32{}, 0
		}
		out[i] = r
	}
	return out
}

// checkDelivery compares what the trainers applied in epoch with the shard
// expectation: every batch of every rank, equal rows (ids, tokens, tensors).
func checkDelivery(t testing.TB, cfg Config, trs []*trainer, epoch int, ex expected) {
	t.Helper()
	if ex.steps == 0 {
		t.Fatal("the plan has no steps: the test would check nothing")
	}
	for _, tr := range trs {
		mod, _ := proto.ModalityFor(cfg.layout().Placement, cfg.MP, tr.mp)
		n := 0
		for k := range tr.applied {
			if k.Epoch == epoch {
				n++
			}
		}
		if want := ex.steps * cfg.Pipeline.Plan.MicroBatches; n != want {
			t.Errorf("rank %d.%d applied %d batches of epoch %d, want steps × micro-batches = %d", tr.dp, tr.mp, n, epoch, want)
		}
		for step := range ex.steps {
			for mb := range cfg.Pipeline.Plan.MicroBatches {
				k := proto.BatchKey{Job: cfg.Job, Epoch: epoch, Step: step, MicroBatch: mb, DPRank: tr.dp, MPRank: tr.mp}
				got, ok := tr.applied[k]
				if !ok {
					t.Errorf("rank %d.%d: %v never applied", tr.dp, tr.mp, k)
					continue
				}
				want := project(mod, ex.rows[[3]int{step, tr.dp, mb}])
				if !reflect.DeepEqual(normRows(got), normRows(want)) {
					t.Errorf("%v: rows differ from the shard's (got %d rows %v, want %d rows %v)", k, len(got), ids(got), len(want), ids(want))
				}
			}
		}
	}
}

// normRows maps empty slices to nil so that DeepEqual compares content.
func normRows(rows []proto.Row) []proto.Row {
	out := make([]proto.Row, len(rows))
	for i, r := range rows {
		if len(r.InputIDs) == 0 {
			r.InputIDs = nil
		}
		if len(r.Pixels) == 0 {
			r.Pixels = nil
		}
		out[i] = r
	}
	return out
}

func ids(rows []proto.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

// realOnce checks every planned sample was applied exactly once with weight
// 1 (over the mp-rank-0 trainers) and that planned + dropped + quarantined =
// seen.
func realOnce(t testing.TB, trs []*trainer, epoch int, ex expected, quarantined int) {
	t.Helper()
	count := map[string]int{}
	for _, tr := range trs {
		if tr.mp != 0 {
			continue
		}
		for k, rows := range tr.applied {
			if k.Epoch != epoch {
				continue
			}
			for _, r := range rows {
				if r.Weight > 0 {
					count[r.ID]++
				}
			}
		}
	}
	var dup []string
	for id, n := range count {
		if n != 1 {
			dup = append(dup, id+":"+strconv.Itoa(n))
		}
	}
	sort.Strings(dup)
	if len(dup) > 0 {
		t.Errorf("epoch %d: samples applied more than once: %v", epoch, dup)
	}
	if got := len(count) + len(ex.plan.Dropped) + quarantined; got != ex.seen {
		t.Errorf("epoch %d: applied %d + dropped %d + quarantined %d = %d, want seen %d", epoch, len(count), len(ex.plan.Dropped), quarantined, got, ex.seen)
	}
}

// quarantinedIDs returns the distinct ids of an epoch's quarantine file.
func quarantinedIDs(t testing.TB, dir string, epoch int) map[string]bool {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("%s/quarantine-e%d.jsonl", dir, epoch))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rj, err := loader.ReadQuarantine(f)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, r := range rj {
		out[r.ID] = true
	}
	return out
}

func itoa(i int) string { return strconv.Itoa(i) }

func errorf(format string, a ...any) error { return fmt.Errorf(format, a...) }

// firstHeld is the key of the first batch the data plane holds for rank
// (false when it holds none).
func firstHeld(s *Service, rank int) (proto.BatchKey, bool) {
	h, ok, err := s.plane.FirstHeld(context.Background(), rank)
	return h.BatchKey, ok && err == nil
}
