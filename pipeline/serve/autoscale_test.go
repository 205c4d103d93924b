package serve

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
)

// gauges reads the autoscaling gauges from the service's registry; a gauge
// the scrape did not report is absent from the map.
func gauges(s *Service) (map[string]float64, error) {
	mfs, err := s.Registry().Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if g := m.GetGauge(); g != nil && len(m.GetLabel()) == 0 {
				out[mf.GetName()] = g.GetValue()
			}
		}
	}
	return out, nil
}

// stallLog records, per rank, when its trainer first waited for a batch: a
// step whose batches took more than stall to arrive after the trainer was
// ready for them.
type stallLog struct {
	mu    sync.Mutex
	prev  map[int]time.Time
	first time.Time // zero: no rank waited
	stall time.Duration
	delay time.Duration // the trainers' step time (slept after each step)
}

func (l *stallLog) step(rank int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if p, ok := l.prev[rank]; ok && now.Sub(p)-l.delay > l.stall && l.first.IsZero() {
		l.first = now
	}
	l.prev[rank] = now
}

func (l *stallLog) waited() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.first
}

// One worker with one slot, slowed to itemDelay per batch item, and
// trainers that take about 1.6 slots' worth of items per second (dp 2 × 2
// micro-batches per step, one step per ~0.375 s): mmfeed_serve_workers_needed
// rises above 1 while the steps built ahead still last (before any rank
// waits); a second such worker, started then as an autoscaler would, is
// counted in mmfeed_serve_workers and brings the gauge per worker (what
// an HPA with averageValue 1 compares) back to at most 1.
func TestWorkersNeededRisesBeforeRanksWait(t *testing.T) {
	defer func(w time.Duration) { scaleWindow = w }(scaleWindow)
	scaleWindow = 3 * time.Second
	const (
		itemDelay = 150 * time.Millisecond
		stepDelay = 350 * time.Millisecond // 4 items a step: ≈ 4 × 0.15 / 0.375 = 1.6 slots
		prefill   = 8                      // steps built before the trainers start
	)
	cfg := testConfig(t, corpus(t, 300), 2, 1, "colocated")
	cfg.Role, cfg.Recalibrate, cfg.WorkAckWait = RolePlanner, -1, 2*time.Second
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	workerErrs := make(chan error, 2)
	startWorker := func(name string) {
		wc := work.WorkerConfig{NATS: natsenv.Config{URLs: []string{r.s.ClientURL()}}, Slots: 1, BuildDelay: itemDelay,
			Logger: testLogger(t).With("worker", name)}
		go func() { workerErrs <- work.RunWorker(ctx, wc) }()
	}
	startWorker("a")
	perStep := int64(cfg.Pipeline.Plan.DP * cfg.Pipeline.Plan.MicroBatches * cfg.MP)
	checkFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		if n := r.s.Stats().Batches; n < prefill*perStep {
			return fmt.Errorf("%d batches built, want %d steps' worth", n, prefill*perStep)
		}
		return nil
	})
	if g, err := gauges(r.s); err != nil || g["mmfeed_serve_workers_needed"] != 0 || g["mmfeed_serve_workers"] != 1 {
		t.Fatalf("before the trainers: gauges %v (%v), want workers_needed 0 (no demand) and 1 worker", g, err)
	}

	stalls := &stallLog{prev: map[int]time.Time{}, stall: 150 * time.Millisecond, delay: stepDelay}
	type sighting struct {
		at     time.Time
		gauges map[string]float64
	}
	var rose, back sighting
	monitorErr := make(chan error, 1)
	go func() { // the autoscaler: a second worker once one is not enough
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				monitorErr <- fmt.Errorf("workers_needed never rose above 1 and came back: rose %+v, back %+v", rose, back)
				return
			case <-tick.C:
			}
			g, err := gauges(r.s)
			if err != nil {
				monitorErr <- err
				return
			}
			need, ok := g["mmfeed_serve_workers_needed"]
			switch {
			case rose.at.IsZero() && ok && need > 1:
				rose = sighting{time.Now(), g}
				startWorker("b")
			case !rose.at.IsZero() && g["mmfeed_serve_workers"] == 2 && need/2 <= 1:
				back = sighting{time.Now(), g}
				monitorErr <- nil
				return
			}
		}
	}()
	trs := runTrainersWith(t, ctx, cfg, r.s.ClientURL(), []int{0}, true, func(tr *trainer) {
		tr.stepDelay = stepDelay
		rank := tr.dp*cfg.MP + tr.mp
		tr.barrier = func(context.Context, proto.BatchKey) error { stalls.step(rank); return nil }
	})
	if err := <-monitorErr; err != nil {
		t.Fatal(err)
	}
	t.Logf("rose above 1 at %v: %v", rose.at.Format(time.StampMilli), rose.gauges)
	t.Logf("back at %v: %v", back.at.Format(time.StampMilli), back.gauges)
	t.Logf("first rank wait: %v (zero: none)", stalls.waited().Format(time.StampMilli))
	if w := stalls.waited(); !w.IsZero() && !rose.at.Before(w) {
		t.Errorf("a rank first waited at %v, before workers_needed rose above 1 at %v", w.Format(time.StampMilli), rose.at.Format(time.StampMilli))
	}
	if g := rose.gauges; g["mmfeed_serve_workers"] != 1 || g["mmfeed_serve_slack_seconds"] <= 0 || g["mmfeed_serve_demand_microbatches_per_second"] <= 0 ||
		g["mmfeed_serve_work_seconds_per_item"] < itemDelay.Seconds() {
		t.Errorf("when workers_needed rose: %v; want 1 worker, slack > 0, demand > 0 and item seconds ≥ the worker's %v", g, itemDelay)
	}
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("planner: %v", err)
	}
	if len(trs) != cfg.ranks() {
		t.Fatalf("%d trainers", len(trs))
	}
	cancel()
	for range 2 {
		if err := <-workerErrs; err != nil {
			t.Errorf("worker: %v", err)
		}
	}
}
