package serve

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/prometheus/client_golang/prometheus"
)

// Autoscaling gauges (planner role): what an autoscaler needs to size the
// worker pool, from measured times only. docs/deployment.md, "Autoscaling
// workers", explains each formula, unit and window.
//
//   - mmfeed_serve_work_backlog_seconds: Σ over the issued batch items not
//     yet delivered (queued or in flight) of their predicted worker seconds
//     (the cost model fitted to the workers' measured item times).
//   - mmfeed_serve_consumption_microbatches_per_second: the micro-batches
//     (work items: one dp rank's micro-batch) the trainers took per second
//     over the window; mmfeed_serve_demand_microbatches_per_second is the
//     same over the time they did not wait for data (their reported data
//     wait taken out): what they would take were the workers fast enough.
//   - mmfeed_serve_slack_seconds: min over the ranks of the steps built
//     ahead of the rank divided by its demand in steps per second: how long
//     until the earliest rank would wait.
//   - mmfeed_serve_work_seconds_per_item: the mean measured worker seconds of
//     the items finished in the window; mmfeed_serve_workers and
//     mmfeed_serve_worker_slots: the workers (connections) that finished
//     them, and their slots.
//   - mmfeed_serve_workers_needed = demand × seconds per item ÷ slots per
//     worker: workers of the present size that keep up with the demand (no
//     ceiling: an HPA targets averageValue 1).

// scaleWindow is the sliding window of the rates, the per-item seconds and
// the workers (a variable so tests can shorten it).
var scaleWindow = 30 * time.Second

// maxWorkerSlots bounds the slots a worker's done message may claim.
const maxWorkerSlots = 1 << 12

// scaleEvent is one timed observation: steps taken, seconds waited.
type scaleEvent struct {
	at time.Time
	v  float64
}

// scaleItem is one batch item a worker finished.
type scaleItem struct {
	at     time.Time
	secs   float64
	worker string // the worker's connection (its reply inbox prefix)
	slots  int
}

// rankScale is one rank's observations.
type rankScale struct {
	steps, waits []scaleEvent
	lastReport   time.Time // the rank's previous feedback (bounds a reported wait)
	held         float64   // the last demand measured (steps/s), kept while the rank starves
}

// autoscaler owns the observations the autoscaling gauges are computed
// from: the ranks' step advances and data waits, and the items the workers
// finished, each kept for the window. Safe for concurrent use; its lock is
// a leaf.
type autoscaler struct {
	window time.Duration
	now    func() time.Time

	mu        sync.Mutex
	ranks     []rankScale
	items     []scaleItem
	lastItems itemStats // the last window with items (held while none finish)
}

func newAutoscaler(ranks int) *autoscaler {
	return &autoscaler{window: scaleWindow, now: time.Now, ranks: make([]rankScale, ranks)}
}

// taken records that rank r's trainer moved forward by steps.
func (a *autoscaler) taken(r int, steps int) {
	if a == nil || steps <= 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if r < 0 || r >= len(a.ranks) {
		return
	}
	now := a.now()
	rs := &a.ranks[r]
	rs.steps = append(trimEvents(rs.steps, now, a.window), scaleEvent{now, float64(steps)})
}

// waited records a rank's reported data wait of one step, bounded by the
// time since the rank's previous report: a report cannot claim more wait
// than elapsed (invariant 6).
func (a *autoscaler) waited(r int, secs float64) {
	if a == nil || !(secs >= 0) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if r < 0 || r >= len(a.ranks) {
		return
	}
	now := a.now()
	rs := &a.ranks[r]
	gap := a.window.Seconds()
	if !rs.lastReport.IsZero() {
		gap = min(gap, now.Sub(rs.lastReport).Seconds())
	}
	rs.lastReport = now
	rs.waits = append(trimEvents(rs.waits, now, a.window), scaleEvent{now, min(secs, gap)})
}

// itemDone records a batch item a worker finished in secs; slots is the
// worker's claim (out of range: 1).
func (a *autoscaler) itemDone(secs float64, worker string, slots int) {
	if a == nil || !(secs > 0) || math.IsInf(secs, 0) {
		return
	}
	if slots < 1 || slots > maxWorkerSlots {
		slots = 1
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	a.items = append(trimItems(a.items, now, a.window), scaleItem{now, secs, worker, slots})
}

// trimEvents drops the events older than the window.
func trimEvents(ev []scaleEvent, now time.Time, window time.Duration) []scaleEvent {
	i := 0
	for i < len(ev) && now.Sub(ev[i].at) > window {
		i++
	}
	return append(ev[:0], ev[i:]...)
}

func trimItems(it []scaleItem, now time.Time, window time.Duration) []scaleItem {
	i := 0
	for i < len(it) && now.Sub(it[i].at) > window {
		i++
	}
	return append(it[:0], it[i:]...)
}

// rankRate is one rank's rates over the window: observed is the steps per
// second between its first and last advance in the window, demand the same
// over that time less the data waits reported in it; ok is false with
// fewer than two advances (no interval to measure).
func rankRate(steps, waits []scaleEvent, now time.Time, window time.Duration) (observed, demand float64, ok bool) {
	var first, last time.Time
	n, taken := 0, 0.0
	for _, e := range steps {
		if now.Sub(e.at) > window {
			continue
		}
		if n == 0 {
			first = e.at
		} else {
			taken += e.v // the first advance opens the interval
		}
		last = e.at
		n++
	}
	span := last.Sub(first).Seconds()
	if n < 2 || span <= 0 {
		return 0, 0, false
	}
	wait := 0.0
	for _, e := range waits {
		if e.at.After(first) && !e.at.After(last) {
			wait += e.v
		}
	}
	observed = taken / span
	if busy := span - wait; busy > 0 {
		return observed, taken / busy, true
	}
	return observed, observed, true
}

// itemStats are the items finished in the window: their mean measured
// seconds, the distinct workers that finished them and those workers'
// slots (each worker's latest claim).
type itemStats struct {
	n              int
	secsPerItem    float64
	workers, slots int
}

func windowItems(items []scaleItem, now time.Time, window time.Duration) itemStats {
	var st itemStats
	sum := 0.0
	slots := map[string]int{}
	for _, it := range items {
		if now.Sub(it.at) > window {
			continue
		}
		st.n++
		sum += it.secs
		slots[it.worker] = it.slots
	}
	if st.n == 0 {
		return st
	}
	st.secsPerItem = sum / float64(st.n)
	st.workers = len(slots)
	for _, s := range slots {
		st.slots += s
	}
	return st
}

// workersNeeded is how many workers of slotsPerWorker slots serve demand
// items per second when an item takes secsPerItem on one slot.
func workersNeeded(demand, secsPerItem, slotsPerWorker float64) float64 {
	if slotsPerWorker <= 0 {
		return 0
	}
	return demand * secsPerItem / slotsPerWorker
}

// slackSeconds is min over ranks of ready[r] / rate[r] (steps over steps
// per second); ok is false when no rank consumes.
func slackSeconds(ready, rate []float64) (slack float64, ok bool) {
	slack = math.Inf(1)
	for r := range ready {
		if rate[r] > 0 {
			slack, ok = min(slack, ready[r]/rate[r]), true
		}
	}
	return slack, ok
}

// stepsBetween is the number of steps from p to q (0 when q is not after
// p), with steps(e) the step count of epoch e.
func stepsBetween(p, q pos, steps func(int) int) int {
	if !p.less(q) {
		return 0
	}
	if p.Epoch == q.Epoch {
		return q.Step - p.Step
	}
	n := max(steps(p.Epoch)-p.Step, 0) + q.Step
	for e := p.Epoch + 1; e < q.Epoch; e++ {
		n += steps(e)
	}
	return n
}

// scaleSnapshot is what the gauges report at one scrape.
type scaleSnapshot struct {
	backlog             float64 // predicted worker seconds of the undelivered items
	backlogOK           bool    // the cost model has measured items
	consumption, demand float64 // micro-batches (work items) per second
	slack               float64
	slackOK             bool
	items               itemStats // the window's, or the last window that had items
	needed              float64
	neededOK            bool
}

// snapshot computes the gauges from the observations, the steps built ahead
// of each rank (ready, in steps) and the layout (mp ranks per dp rank,
// micro-batches per step).
func (a *autoscaler) snapshot(ready []float64, mp, microBatches int) scaleSnapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	var sn scaleSnapshot
	rates := make([]float64, len(a.ranks))
	for r := range a.ranks {
		rs := &a.ranks[r]
		obs, dem, ok := rankRate(rs.steps, rs.waits, now, a.window)
		switch {
		case ok:
			rs.held = dem
		case r < len(ready) && ready[r] <= 0:
			dem = rs.held // starving: no advance to measure, the demand is what it was
		default:
			rs.held = 0 // idle with batches ready
		}
		rates[r] = dem
		sn.consumption += obs * float64(microBatches) / float64(mp)
		sn.demand += dem * float64(microBatches) / float64(mp)
	}
	sn.slack, sn.slackOK = slackSeconds(ready, rates)
	if st := windowItems(a.items, now, a.window); st.n > 0 {
		a.lastItems = st
	}
	sn.items = a.lastItems
	if sn.items.n > 0 {
		sn.needed = workersNeeded(sn.demand, sn.items.secsPerItem, float64(sn.items.slots)/float64(sn.items.workers))
		sn.neededOK = true
	}
	return sn
}

// advanced is the rankTable's hook: rank r's trainer moved from one step
// to a later one.
func (s *Service) advanced(r int, from, to pos) {
	if s.work != nil {
		s.work.scale.taken(r, stepsBetween(from, to, s.epochs.Steps))
	}
}

// readySteps returns, per rank, the steps built ahead of its next needed
// step: published (in the outbox or the stream), queued to its publisher,
// or delivered by the workers in order after those.
func (s *Service) readySteps() []float64 {
	ranks := s.ranks.all()
	out := make([]float64, len(ranks))
	for r, rs := range ranks {
		next := s.epochs.Norm(rs.next)
		var base pos = s.epochs.Norm(rs.cursor)
		if q, ok := s.work.queuedThrough(); ok && base.less(s.epochs.Norm(q)) {
			base = s.epochs.Norm(q)
		}
		if base.less(next) {
			base = next
		}
		built := s.work.builtFrom(r/s.cfg.MP, s.cfg.Pipeline.Plan.MicroBatches, base, s.epochs.Norm)
		out[r] = float64(stepsBetween(next, built, s.epochs.Steps))
	}
	return out
}

// scaleCollector reports the autoscaling gauges at scrape time, from memory.
type scaleCollector struct{ s *Service }

var (
	descBacklog = prometheus.NewDesc("mmfeed_serve_work_backlog_seconds",
		"Planner: predicted worker seconds (one slot) of the batch items issued and not yet delivered, queued or in flight.", nil, nil)
	descConsumption = prometheus.NewDesc("mmfeed_serve_consumption_microbatches_per_second",
		"Planner: micro-batches (work items: one dp rank's micro-batch) the trainers took per second over the window.", nil, nil)
	descDemand = prometheus.NewDesc("mmfeed_serve_demand_microbatches_per_second",
		"Planner: micro-batches per second the trainers take over the time they did not wait for data (their reported data wait taken out).", nil, nil)
	descSlack = prometheus.NewDesc("mmfeed_serve_slack_seconds",
		"Planner: seconds until the earliest rank would wait: min over ranks of the steps built ahead of it over its demand in steps per second.", nil, nil)
	descItemSeconds = prometheus.NewDesc("mmfeed_serve_work_seconds_per_item",
		"Planner: mean measured worker seconds (one slot) of the batch items finished in the window.", nil, nil)
	descWorkers = prometheus.NewDesc("mmfeed_serve_workers",
		"Planner: workers that finished batch items in the window.", nil, nil)
	descWorkerSlots = prometheus.NewDesc("mmfeed_serve_worker_slots",
		"Planner: the slots of the workers that finished batch items in the window.", nil, nil)
	descNeeded = prometheus.NewDesc("mmfeed_serve_workers_needed",
		"Planner: workers of the present mean size that keep up with the trainers' demand: demand × item seconds ÷ slots per worker (no ceiling).", nil, nil)
	descWindow = prometheus.NewDesc("mmfeed_serve_autoscale_window_seconds",
		"Planner: the sliding window of the autoscaling gauges.", nil, nil)
)

func (c *scaleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBacklog, descConsumption, descDemand, descSlack, descItemSeconds, descWorkers, descWorkerSlots, descNeeded, descWindow} {
		ch <- d
	}
}

func (c *scaleCollector) Collect(ch chan<- prometheus.Metric) {
	sn := c.s.scaleSnapshot()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	g(descWindow, c.s.work.scale.window.Seconds())
	g(descConsumption, sn.consumption)
	g(descDemand, sn.demand)
	if sn.backlogOK {
		g(descBacklog, sn.backlog)
	}
	if sn.slackOK {
		g(descSlack, sn.slack)
	}
	if sn.items.n > 0 {
		g(descItemSeconds, sn.items.secsPerItem)
		g(descWorkers, float64(sn.items.workers))
		g(descWorkerSlots, float64(sn.items.slots))
	}
	if sn.neededOK {
		g(descNeeded, sn.needed)
	}
}

// scaleSnapshot computes the autoscaling gauges now (planner role).
func (s *Service) scaleSnapshot() scaleSnapshot {
	ready := s.readySteps()
	sn := s.work.scale.snapshot(ready, s.cfg.MP, s.cfg.Pipeline.Plan.MicroBatches)
	sn.backlog, sn.backlogOK = s.work.backlogSeconds()
	return sn
}

// registerScale installs the rank hook and the autoscaling gauges (planner
// role, before the control handlers run).
func (s *Service) registerScale() error {
	s.work.scale = newAutoscaler(s.cfg.ranks())
	s.ranks.advanced = s.advanced
	return s.reg.Register(&scaleCollector{s})
}

// workerSlots parses a done message's slots header (0 when absent or bad).
func workerSlots(v string) int {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0
	}
	return n
}

// scaleFeedback records a validated feedback's data wait (planner role).
func (s *Service) scaleFeedback(fb proto.Feedback) {
	if s != nil && s.work != nil {
		s.work.scale.waited(fb.DPRank*s.cfg.MP+fb.MPRank, fb.DataWaitSeconds)
	}
}

// queuedThrough returns the step after the last one handed to the rank
// publishers in this run (forgetStep); ok is false before any (a new run).
func (w *workPlanner) queuedThrough() (pos, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.queued, w.queuedOK
}

// builtFrom returns the first step from p on (normalised by norm) that the
// workers have not delivered every micro-batch of for dp rank dp.
func (w *workPlanner) builtFrom(dp, microBatches int, p pos, norm func(epochs.Pos) epochs.Pos) pos {
	w.mu.Lock()
	defer w.mu.Unlock()
	for p = norm(p); ; p = norm(pos{p.Epoch, p.Step + 1}) {
		for mb := range microBatches {
			if sl := w.slots[work.Key{Epoch: p.Epoch, Step: p.Step, DP: dp, MicroBatch: mb}]; sl == nil || sl.have < w.mp {
				return p
			}
		}
		if microBatches <= 0 {
			return p
		}
	}
}

// backlogSeconds is the predicted worker seconds of the issued items not
// yet delivered; ok is false before any item was measured.
func (w *workPlanner) backlogSeconds() (float64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.model.Fitted() {
		return 0, false
	}
	sum := 0.0
	for _, sl := range w.slots {
		if sl.have < w.mp {
			sum += w.model.Predict(sl.cost)
		}
	}
	return sum, true
}
