package work

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

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

// Autoscaler owns the observations the autoscaling gauges are computed
// from: the ranks' step advances and data waits, and the items the workers
// finished, each kept for the window. Safe for concurrent use; its lock is
// a leaf.
type Autoscaler struct {
	window time.Duration
	now    func() time.Time

	mu        sync.Mutex
	ranks     []rankScale
	items     []scaleItem
	lastItems ItemStats // the last window with items (held while none finish)
}

// NewAutoscaler keeps the observations of ranks ranks for window (the
// sliding window of the rates, the per-item seconds and the workers).
func NewAutoscaler(ranks int, window time.Duration) *Autoscaler {
	return &Autoscaler{window: window, now: time.Now, ranks: make([]rankScale, ranks)}
}

// Window is the sliding window of the gauges.
func (a *Autoscaler) Window() time.Duration { return a.window }

// Taken records that rank r's trainer moved forward by steps.
func (a *Autoscaler) Taken(r int, steps int) {
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

// Waited records a rank's reported data wait of one step, bounded by the
// time since the rank's previous report: a report cannot claim more wait
// than elapsed (invariant 6).
func (a *Autoscaler) Waited(r int, secs float64) {
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
func (a *Autoscaler) itemDone(secs float64, worker string, slots int) {
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

// ItemStats are the items finished in the window: their mean measured
// seconds, the distinct workers that finished them and those workers'
// slots (each worker's latest claim).
type ItemStats struct {
	N              int
	SecsPerItem    float64
	Workers, Slots int
}

func windowItems(items []scaleItem, now time.Time, window time.Duration) ItemStats {
	var st ItemStats
	sum := 0.0
	slots := map[string]int{}
	for _, it := range items {
		if now.Sub(it.at) > window {
			continue
		}
		st.N++
		sum += it.secs
		slots[it.worker] = it.slots
	}
	if st.N == 0 {
		return st
	}
	st.SecsPerItem = sum / float64(st.N)
	st.Workers = len(slots)
	for _, s := range slots {
		st.Slots += s
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

// Scale is what the autoscaling gauges report at one scrape.
type Scale struct {
	Backlog             float64 // predicted worker seconds of the undelivered items (Planner.BacklogSeconds)
	BacklogOK           bool    // the cost model has measured items
	Consumption, Demand float64 // micro-batches (work items) per second
	Slack               float64
	SlackOK             bool
	Items               ItemStats // the window's, or the last window that had items
	Needed              float64
	NeededOK            bool
}

// Snapshot computes the gauges from the observations, the steps built ahead
// of each rank (ready, in steps) and the layout (mp ranks per dp rank,
// micro-batches per step).
func (a *Autoscaler) Snapshot(ready []float64, mp, microBatches int) Scale {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	var sn Scale
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
		sn.Consumption += obs * float64(microBatches) / float64(mp)
		sn.Demand += dem * float64(microBatches) / float64(mp)
	}
	sn.Slack, sn.SlackOK = slackSeconds(ready, rates)
	if st := windowItems(a.items, now, a.window); st.N > 0 {
		a.lastItems = st
	}
	sn.Items = a.lastItems
	if sn.Items.N > 0 {
		sn.Needed = workersNeeded(sn.Demand, sn.Items.SecsPerItem, float64(sn.Items.Slots)/float64(sn.Items.Workers))
		sn.NeededOK = true
	}
	return sn
}

// workerSlots parses a done message's slots header (0 when absent or bad).
func workerSlots(v string) int {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0
	}
	return n
}

// QueuedThrough returns the step after the last one handed to the rank
// publishers in this run (ForgetStep); ok is false before any (a new run).
func (w *Planner) QueuedThrough() (proto.Pos, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.queued, w.queuedOK
}

// BuiltFrom returns the first step from p on (normalised by norm) that the
// workers have not delivered every micro-batch of for dp rank dp.
func (w *Planner) BuiltFrom(dp, microBatches int, p proto.Pos, norm func(proto.Pos) proto.Pos) proto.Pos {
	w.mu.Lock()
	defer w.mu.Unlock()
	for p = norm(p); ; p = norm(proto.Pos{Epoch: p.Epoch, Step: p.Step + 1}) {
		for mb := range microBatches {
			if sl := w.slots[Key{Epoch: p.Epoch, Step: p.Step, DP: dp, MicroBatch: mb}]; sl == nil || sl.have < w.mp {
				return p
			}
		}
		if microBatches <= 0 {
			return p
		}
	}
}

// BacklogSeconds is the predicted worker seconds of the issued items not
// yet delivered; ok is false before any item was measured.
func (w *Planner) BacklogSeconds() (float64, bool) {
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

// SetAutoscaler makes a the planner's autoscaling observations (the items
// the workers finish). Call it before Subscribe.
func (w *Planner) SetAutoscaler(a *Autoscaler) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.scale = a
}

// Autoscaler returns the planner's autoscaling observations (nil before
// SetAutoscaler).
func (w *Planner) Autoscaler() *Autoscaler {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.scale
}
