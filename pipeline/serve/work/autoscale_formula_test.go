package work

import (
	"math"
	"testing"
	"time"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(b)) }

// The gauges' formulas, one case per rule: the rates over the window and
// their wait correction, the per-item seconds and workers, workers needed
// and slack (the step distance across epochs is serve's, TestStepsBetween).
func TestAutoscaleFormulas(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	ev := func(pairs ...float64) []scaleEvent {
		var out []scaleEvent
		for i := 0; i < len(pairs); i += 2 {
			out = append(out, scaleEvent{at(pairs[i]), pairs[i+1]})
		}
		return out
	}
	w := 10 * time.Second
	steady := ev(0, 1, 0.5, 1, 1, 1, 1.5, 1, 2, 1)
	for _, tc := range []struct {
		name                string
		steps, waits        []scaleEvent
		now                 float64
		wantObs, wantDemand float64
		wantOK              bool
	}{
		{"one advance: no interval", ev(1, 1), nil, 2, 0, 0, false},
		{"steady: 4 steps over 2 s", steady, nil, 2, 2, 2, true},
		{"multi-step advance counts its steps", ev(0, 1, 1, 3), nil, 1, 3, 3, true},
		{"waits taken out: 4 steps in 2 s, 1 s waited", steady, ev(0.5, 0.25, 1, 0.25, 1.5, 0.25, 2, 0.25), 2, 2, 4, true},
		{"outside the window: dropped", ev(0, 1, 20, 1, 21, 1, 22, 1), nil, 22, 1, 1, true},
		{"a wait at or before the first advance does not count", ev(0, 1, 1, 1), ev(0, 5), 1, 1, 1, true},
		{"waited the whole interval: the observed rate", ev(0, 1, 1, 1), ev(1, 1), 1, 1, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs, dem, ok := rankRate(tc.steps, tc.waits, at(tc.now), w)
			if ok != tc.wantOK || !near(obs, tc.wantObs) || !near(dem, tc.wantDemand) {
				t.Errorf("rankRate = %v, %v, %v; want %v, %v, %v", obs, dem, ok, tc.wantObs, tc.wantDemand, tc.wantOK)
			}
		})
	}

	for _, tc := range []struct {
		name  string
		items []scaleItem
		want  ItemStats
	}{
		{"none", nil, ItemStats{}},
		{"two workers, the latest slots claim each", []scaleItem{{at(10), 0.1, "a", 1}, {at(11), 0.3, "b", 4}, {at(12), 0.2, "a", 2}},
			ItemStats{N: 3, SecsPerItem: 0.2, Workers: 2, Slots: 6}},
		{"old items leave the window", []scaleItem{{at(0), 9, "a", 1}, {at(15), 0.5, "b", 2}}, ItemStats{N: 1, SecsPerItem: 0.5, Workers: 1, Slots: 2}},
	} {
		t.Run("items/"+tc.name, func(t *testing.T) {
			got := windowItems(tc.items, at(15), w)
			if got.N != tc.want.N || got.Workers != tc.want.Workers || got.Slots != tc.want.Slots || !near(got.SecsPerItem, tc.want.SecsPerItem) {
				t.Errorf("windowItems = %+v, want %+v", got, tc.want)
			}
		})
	}

	for _, tc := range []struct {
		demand, secs, slots, want float64
	}{
		{20, 0.1, 1, 2},   // 20 items/s × 0.1 s on one slot: two 1-slot workers
		{20, 0.1, 4, 0.5}, // the same on 4-slot workers: half of one
		{0, 0.1, 1, 0},    // no demand
		{20, 0.1, 0, 0},   // no slots known
	} {
		if got := workersNeeded(tc.demand, tc.secs, tc.slots); !near(got, tc.want) {
			t.Errorf("workersNeeded(%v, %v, %v) = %v, want %v", tc.demand, tc.secs, tc.slots, got, tc.want)
		}
	}

	for _, tc := range []struct {
		ready, rate []float64
		want        float64
		ok          bool
	}{
		{[]float64{4, 2}, []float64{2, 2}, 1, true}, // the earliest rank: 2 steps at 2 steps/s
		{[]float64{4, 2}, []float64{1, 0}, 4, true}, // a rank that does not consume never waits
		{[]float64{4, 2}, []float64{0, 0}, 0, false},
		{[]float64{0, 3}, []float64{1, 1}, 0, true}, // one rank waits now
	} {
		got, ok := slackSeconds(tc.ready, tc.rate)
		if ok != tc.ok || (ok && !near(got, tc.want)) {
			t.Errorf("slackSeconds(%v, %v) = %v, %v; want %v, %v", tc.ready, tc.rate, got, ok, tc.want, tc.ok)
		}
	}
}

// The autoscaler's own rules: a reported wait is bounded by the time since
// the rank's previous report; a rank with no advance in the window keeps
// its demand while it starves (nothing built ahead of it) and reads 0 while
// it is idle with batches ready; the item statistics hold while no item
// finishes; a bad slots claim counts as one slot.
func TestAutoscalerRules(t *testing.T) {
	now := time.Unix(1000, 0)
	a := NewAutoscaler(2, 10*time.Second)
	a.now = func() time.Time { return now }
	step := func(d time.Duration) { now = now.Add(d) }

	a.Waited(0, 0)
	step(time.Second)
	a.Waited(0, 1e6) // a forged wait: at most the second since the last report
	if got := a.ranks[0].waits[1].v; !near(got, 1) {
		t.Errorf("a wait of 1e6 s a second after the last report counts %v s, want 1", got)
	}
	a.Waited(0, math.NaN())
	if n := len(a.ranks[0].waits); n != 2 {
		t.Errorf("a NaN wait was recorded (%d waits)", n)
	}

	for range 5 { // rank 0: 2 steps/s; rank 1 the same
		a.Taken(0, 1)
		a.Taken(1, 1)
		a.itemDone(0.25, "w1", 1<<20) // a bad slots claim: one slot
		step(500 * time.Millisecond)
	}
	sn := a.Snapshot([]float64{3, 3}, 1, 2)
	// 2 ranks × 2 steps/s × 2 micro-batches; 8 items/s × 0.25 s ÷ 1 slot = 2 workers.
	if !near(sn.Consumption, 8) || !near(sn.Demand, 8) || !sn.NeededOK || !near(sn.Needed, 2) || !sn.SlackOK || !near(sn.Slack, 1.5) {
		t.Errorf("steady: %+v; want consumption = demand = 8, needed 2, slack 1.5", sn)
	}
	step(20 * time.Second) // nothing in the window any more
	sn = a.Snapshot([]float64{0, 4}, 1, 2)
	if !near(sn.Demand, 4) || !near(sn.Consumption, 0) {
		t.Errorf("rank 0 starving, rank 1 idle: demand %v, consumption %v; want 4 (rank 0's held), 0", sn.Demand, sn.Consumption)
	}
	if !sn.NeededOK || !near(sn.Needed, 1) || sn.Items.N != 5 {
		t.Errorf("no item in the window: needed %v (ok %v), items %+v; want the last window's statistics held: 1", sn.Needed, sn.NeededOK, sn.Items)
	}
	if !sn.SlackOK || !near(sn.Slack, 0) {
		t.Errorf("slack %v (ok %v), want 0: rank 0 waits now", sn.Slack, sn.SlackOK)
	}
}
