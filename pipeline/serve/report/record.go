package report

import (
	"maps"
	"math"
	"slices"
	"sync"

	"github.com/mmfeed/mmfeed/proto"
)

// maxPendingSteps bounds the steps per epoch a runRecord holds while their
// ranks report (the oldest is dropped, counted as incomplete).
const maxPendingSteps = 1024

// runRecord accumulates what the run report (run.go) says the
// trainers measured, per epoch, over the whole run (the live report keeps
// only the newest steps): each dp rank's step times (the slowest of its mp
// ranks, as calibration takes them) and data waits, and per step the
// measured imbalance (max/mean of the dp ranks' times) beside the predicted
// one (max/mean of the plan's rank costs). A step counts once every (dp, mp)
// rank reported it; a repeated report counts once. Only steps this service
// published are measured (a step published before a restart is not), and
// a time that is negative or not finite is ignored. Safe for concurrent use;
// its lock is a leaf.
type runRecord struct {
	mu     sync.Mutex
	dp, mp int
	epochs map[int]*epochRecord
}

// epochRecord is one epoch's measurements.
type epochRecord struct {
	published  int
	planned    imbalanceAcc         // predicted imbalance over every published step
	predicted  map[int]float64      // step → predicted imbalance, until measured
	pending    map[int]*stepPending // steps some ranks reported
	done       map[int]bool         // steps measured (every rank reported)
	ranks      []rankAcc
	measured   imbalanceAcc // measured imbalance over the measured steps
	predSame   imbalanceAcc // predicted imbalance over the same steps
	incomplete int
}

type stepPending struct {
	seconds, wait []float64 // per dp rank, max over its mp ranks
	seen          map[int]bool
}

type rankAcc struct {
	steps               int
	sum, top, waitTotal float64
}

type imbalanceAcc struct {
	n        int
	sum, top float64
}

func (a *imbalanceAcc) add(v float64) {
	a.n++
	a.sum += v
	a.top = max(a.top, v)
}

func (a imbalanceAcc) stats() ImbalanceStats {
	if a.n == 0 {
		return ImbalanceStats{}
	}
	return ImbalanceStats{Steps: a.n, Mean: a.sum / float64(a.n), Max: a.top}
}

func newRunRecord(dp, mp int) *runRecord {
	return &runRecord{dp: max(dp, 1), mp: max(mp, 1), epochs: map[int]*epochRecord{}}
}

// epochLocked returns epoch e's record, creating it. Caller holds r.mu.
func (r *runRecord) epochLocked(e int) *epochRecord {
	er := r.epochs[e]
	if er == nil {
		er = &epochRecord{predicted: map[int]float64{}, pending: map[int]*stepPending{}, done: map[int]bool{},
			ranks: make([]rankAcc, r.dp)}
		r.epochs[e] = er
	}
	return er
}

// published records a step's first publication with its predicted rank costs.
func (r *runRecord) published(epoch, step int, pred []float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	er := r.epochLocked(epoch)
	if _, ok := er.predicted[step]; ok || er.done[step] {
		return
	}
	imb := Imbalance(pred)
	er.published++
	er.planned.add(imb)
	er.predicted[step] = imb
}

// measured records one rank's feedback on a step.
func (r *runRecord) measured(fb proto.Feedback) {
	if !finiteNonNegative(fb.ComputeSeconds) || !finiteNonNegative(fb.DataWaitSeconds) ||
		fb.DPRank < 0 || fb.DPRank >= r.dp || fb.MPRank < 0 || fb.MPRank >= r.mp {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	er := r.epochs[fb.Epoch]
	if er == nil || er.done[fb.Step] {
		return
	}
	if _, ok := er.predicted[fb.Step]; !ok {
		return // not published by this service
	}
	sp := er.pending[fb.Step]
	if sp == nil {
		if len(er.pending) >= maxPendingSteps {
			er.dropOldest()
		}
		sp = &stepPending{seconds: make([]float64, r.dp), wait: make([]float64, r.dp), seen: map[int]bool{}}
		er.pending[fb.Step] = sp
	}
	k := fb.DPRank*r.mp + fb.MPRank
	if sp.seen[k] {
		return
	}
	sp.seen[k] = true
	sp.seconds[fb.DPRank] = max(sp.seconds[fb.DPRank], fb.ComputeSeconds)
	sp.wait[fb.DPRank] = max(sp.wait[fb.DPRank], fb.DataWaitSeconds)
	if len(sp.seen) == r.dp*r.mp {
		er.fold(fb.Step, sp)
	}
}

// fold adds a step every rank reported to the epoch's figures.
func (er *epochRecord) fold(step int, sp *stepPending) {
	for d, sec := range sp.seconds {
		ra := &er.ranks[d]
		ra.steps++
		ra.sum += sec
		ra.top = max(ra.top, sec)
		ra.waitTotal += sp.wait[d]
	}
	er.measured.add(Imbalance(sp.seconds))
	er.predSame.add(er.predicted[step])
	delete(er.pending, step)
	delete(er.predicted, step)
	er.done[step] = true
}

// dropOldest forgets the lowest pending step (some rank never reported it).
func (er *epochRecord) dropOldest() {
	oldest := math.MaxInt
	for s := range er.pending {
		oldest = min(oldest, s)
	}
	delete(er.pending, oldest)
	delete(er.predicted, oldest)
	er.done[oldest] = true // a late report of it is not a new step
	er.incomplete++
}

func finiteNonNegative(v float64) bool { return v >= 0 && !math.IsInf(v, 1) }

// summary returns the measured figures of every epoch recorded, in epoch order.
func (r *runRecord) summary() []EpochMeasured {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []EpochMeasured
	for _, e := range slices.Sorted(maps.Keys(r.epochs)) {
		er := r.epochs[e]
		em := EpochMeasured{Epoch: e, StepsPublished: er.published, StepsMeasured: er.measured.n,
			StepsIncomplete: er.incomplete, MeasuredImbalance: er.measured.stats(),
			PredictedImbalance: er.predSame.stats(), PlannedImbalance: er.planned.stats()}
		for d, ra := range er.ranks {
			rm := RankMeasured{DP: d, Steps: ra.steps, MaxSeconds: ra.top, TotalSeconds: ra.sum}
			if ra.steps > 0 {
				rm.MeanSeconds = ra.sum / float64(ra.steps)
				rm.MeanDataWaitSeconds = ra.waitTotal / float64(ra.steps)
			}
			em.Ranks = append(em.Ranks, rm)
		}
		out = append(out, em)
	}
	return out
}

// unmeasured reports whether a step in [from, to) was published and not
// every rank reported it yet (none, or some of them).
func (r *runRecord) unmeasured(from, to proto.Pos) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for e, er := range r.epochs {
		for step := range er.predicted {
			if at := (proto.Pos{Epoch: e, Step: step}); !at.Less(from) && at.Less(to) {
				return true
			}
		}
	}
	return false
}

// epochList returns the epochs recorded, in order.
func (r *runRecord) epochList() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.epochs))
}
