package report

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/proto"
)

// maxLiveSteps bounds the steps the live report keeps (the newest).
const maxLiveSteps = 512

// LiveStep is one published step in the live report.
type LiveStep struct {
	Epoch int `json:"epoch"`
	Step  int `json:"step"`
	// Segment indexes Live.Models: the cost model the step was planned with.
	Segment int `json:"segment"`
	// Imbalance is the predicted max/mean of PredictedCost.
	Imbalance float64 `json:"imbalance"`
	// PredictedCost is each dp rank's step cost under the step's model (its unit).
	PredictedCost []float64 `json:"predicted_cost"`
	// PredictedSeconds is each dp rank's step time under the latest
	// calibration (absent before the first).
	PredictedSeconds []float64 `json:"predicted_seconds,omitempty"`
	// MeasuredSeconds is each dp rank's reported compute time (the slowest of
	// its mp ranks); 0 until reported.
	MeasuredSeconds []float64 `json:"measured_seconds"`
	// DataWaitSeconds is each dp rank's reported wait for data (the largest
	// of its mp ranks).
	DataWaitSeconds []float64 `json:"data_wait_seconds"`
	// Samples counts the step's real samples over all dp ranks.
	Samples int `json:"samples"`

	feats []balancer.Features
}

// RankStatus is one (dp, mp) rank in the live report.
type RankStatus struct {
	DP, MP int    `json:"-"`
	Rank   [2]int `json:"rank"`
	// NextEpoch and NextStep: the first step the trainer still needs.
	NextEpoch int `json:"next_epoch"`
	NextStep  int `json:"next_step"`
	// PublishedEpoch and PublishedStep: the next step the service publishes
	// to the rank.
	PublishedEpoch int `json:"published_epoch"`
	PublishedStep  int `json:"published_step"`
	Generation     int `json:"generation"`
}

// Stats is the service's instrumentation: what it published and where the
// publishing goroutines spent their time.
type Stats struct {
	Samples int64 `json:"samples"`
	Batches int64 `json:"batches"`
	// Chunks counts chunk messages (Batches when nothing needed chunking).
	Chunks int64 `json:"chunks"`
	Bytes  int64 `json:"bytes"`
	// ElapsedSeconds is the time since the service started.
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	// PreprocessSeconds is the time the publisher waited for the next
	// preprocessed step (the workers were the bottleneck).
	PreprocessSeconds float64 `json:"preprocess_seconds"`
	// BuildSeconds, EncodeSeconds and PublishSeconds are summed over the
	// ranks' publishing goroutines (they run in parallel); PublishSeconds
	// includes waits on a full stream.
	BuildSeconds   float64 `json:"build_seconds"`
	EncodeSeconds  float64 `json:"encode_seconds"`
	PublishSeconds float64 `json:"publish_seconds"`
}

// Rates summarises what was published.
type Rates struct {
	Stats
	SamplesPerSecond float64 `json:"samples_per_second"`
	BytesPerSecond   float64 `json:"bytes_per_second"`
}

// Live is the live part of /v1/report.
type Live struct {
	Job        string `json:"job"`
	Epoch      int    `json:"epoch"`
	FirstEpoch int    `json:"first_epoch"`
	LastEpoch  int    `json:"last_epoch"`
	// StepsPerEpoch is the current epoch's step count; StepsPublished counts
	// the steps published to every rank so far (all epochs); StepsTrained
	// counts the steps every rank has acknowledged (fed back or acked: the
	// least next needed position over the ranks, from FirstEpoch on; 0
	// until every rank registered). Finished says everything is published:
	// the trainers are done when StepsTrained reaches the job's steps.
	StepsPerEpoch  int  `json:"steps_per_epoch"`
	StepsPublished int  `json:"steps_published"`
	StepsTrained   int  `json:"steps_trained"`
	Finished       bool `json:"finished"`
	// Models lists the cost models of the current epoch's steps.
	Models []epochs.Segment `json:"models"`
	// Calibration is the cost model fitted to every observation of trainer
	// feedback so far (null before MinObservations), with the prior's error
	// on the same observations; Models lists the models the plan used.
	Calibration  *balancer.Calibration `json:"calibration"`
	Observations int                   `json:"observations"`
	// Quarantined counts quarantined samples by reason, all epochs so far.
	Quarantined map[string]int64 `json:"quarantined"`
	Throughput  Rates            `json:"throughput"`
	Ranks       []RankStatus     `json:"ranks"`
	// Steps are the newest published steps, oldest first.
	Steps []LiveStep `json:"steps"`
}

// LiveReport is the /v1/report object: the `mmfeed report --json` object of
// the current epoch (strategy comparison) plus "live".
type LiveReport struct {
	*balancer.Report
	// Mixture is a mixture's per-source lines (`mmfeed report --json`'s
	// "mixture"); absent for a plain input.
	Mixture *pipeline.MixtureReport `json:"mixture,omitempty"`
	Live    Live                    `json:"live"`
}

// State holds the live report's moving parts: the epochs shown, the
// newest published steps with their measurements, the quarantine of every
// epoch and the run record. Safe for concurrent use; its lock is a leaf.
type State struct {
	mu             sync.Mutex
	dp, mp         int
	placement      balancer.Placement
	ep             *epochs.Plan // its prog has the report once the epoch is planned
	prev           *epochs.Plan // the epoch before, whose report is shown until ep's is built
	info           epochs.Info
	steps          []*LiveStep
	index          map[proto.Pos]*LiveStep
	stepsPublished int
	quarant        map[int]*loader.QuarantineWriter
	record         *runRecord // the run report's measurements (record.go); its lock is a leaf
}

// NewState returns the live state of a dp × mp layout whose ranks place
// their samples by placement.
func NewState(dp, mp int, placement balancer.Placement) *State {
	return &State{dp: dp, mp: mp, placement: placement,
		index: map[proto.Pos]*LiveStep{}, quarant: map[int]*loader.QuarantineWriter{}, record: newRunRecord(dp, mp)}
}

func (l *State) SetEpoch(ep *epochs.Plan) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.prev, l.ep, l.info = l.ep, ep, ep.Info()
	l.quarant[ep.Info().Epoch] = ep.Prepared().Quarantine
}

// published records a step the publisher sent (from the publisher goroutine,
// which owns ep's steps).
func (l *State) Published(ep *epochs.Plan, sb pipeline.StepBatch) {
	seg, _ := ep.SegmentAt(sb.Step)
	pred := ep.Predicted(sb.Step)
	st := &LiveStep{Epoch: ep.Info().Epoch, Step: sb.Step, Segment: seg, Imbalance: Imbalance(pred), PredictedCost: pred,
		MeasuredSeconds: make([]float64, len(pred)), DataWaitSeconds: make([]float64, len(pred)),
		feats: slices.Clone(ep.StepFeatures(sb.Step))}
	for _, mbs := range sb.Rows {
		for _, rows := range mbs {
			for i := range rows {
				if rows[i].Weight > 0 {
					st.Samples++
				}
			}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.info = ep.Info()
	k := proto.Pos{Epoch: st.Epoch, Step: st.Step}
	if old := l.index[k]; old != nil { // republished (rewind): keep the measurements
		st.MeasuredSeconds, st.DataWaitSeconds = old.MeasuredSeconds, old.DataWaitSeconds
		l.steps = slices.DeleteFunc(l.steps, func(x *LiveStep) bool { return x == old })
	} else {
		l.stepsPublished++
		l.record.published(st.Epoch, st.Step, pred)
	}
	l.index[k] = st
	l.steps = append(l.steps, st)
	if len(l.steps) > maxLiveSteps {
		delete(l.index, proto.Pos{Epoch: l.steps[0].Epoch, Step: l.steps[0].Step})
		l.steps = l.steps[1:]
	}
}

// measured records a trainer's feedback on a published step.
func (l *State) Measured(fb proto.Feedback) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.record.measured(fb)
	st := l.index[proto.Pos{Epoch: fb.Epoch, Step: fb.Step}]
	if st == nil || fb.DPRank >= len(st.MeasuredSeconds) {
		return
	}
	st.MeasuredSeconds[fb.DPRank] = max(st.MeasuredSeconds[fb.DPRank], fb.ComputeSeconds)
	st.DataWaitSeconds[fb.DPRank] = max(st.DataWaitSeconds[fb.DPRank], fb.DataWaitSeconds)
}

func (l *State) Quarantined() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int64{}
	for _, q := range l.quarant {
		for r, n := range q.Counts() {
			out[r] += n
		}
	}
	return out
}

// quarantineReasons merges the epochs' reasons, with example ids.
func (l *State) quarantineReasons() map[string]balancer.QuarantineGroup {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]balancer.QuarantineGroup{}
	for _, ep := range slices.Sorted(maps.Keys(l.quarant)) {
		for r, g := range pipeline.QuarantineReasons(l.quarant[ep]) {
			o := out[r]
			o.Count += g.Count
			o.Examples = append(o.Examples, g.Examples[:min(len(g.Examples), loader.QuarantineExamples-len(o.Examples))]...)
			out[r] = o
		}
	}
	return out
}

// snapshot returns the parts of the live report the live state holds: the
// strategy comparison of the current epoch (or of the one before until the
// current one's is built) with the quarantine counts of every epoch so far,
// its mixture lines, and the live section's epoch, models, published steps
// and quarantine counts, each step with its predicted seconds under cal
// (none when nil). It returns nil before the comparison is built, unless
// anyway (then Report is nil); the caller fills the rest of Live.
func (l *State) Snapshot(cal *balancer.Calibration, anyway bool) *LiveReport {
	q := l.Quarantined()
	reasons := l.quarantineReasons()
	l.mu.Lock()
	defer l.mu.Unlock()
	var report *balancer.Report
	var mix *pipeline.MixtureReport
	for _, ep := range []*epochs.Plan{l.ep, l.prev} {
		if ep != nil && report == nil {
			_, _, report, _ = ep.Planning()
			mix = ep.MixtureReport()
		}
	}
	if report == nil && !anyway {
		return nil
	}
	var rep *balancer.Report
	if report != nil {
		c := *report
		var total int64
		for _, n := range q {
			total += n
		}
		c.Quarantined = int(total)
		c.QuarantineReasons = reasons
		rep = &c
	}
	lv := Live{Epoch: l.info.Epoch, StepsPerEpoch: l.info.Steps, StepsPublished: l.stepsPublished,
		Models: slices.Clone(l.info.Segments), Quarantined: q}
	lv.Steps = make([]LiveStep, len(l.steps))
	for i, st := range l.steps {
		c := *st
		c.PredictedCost = slices.Clone(st.PredictedCost)
		c.MeasuredSeconds = slices.Clone(st.MeasuredSeconds)
		c.DataWaitSeconds = slices.Clone(st.DataWaitSeconds)
		if cal != nil {
			c.PredictedSeconds = make([]float64, len(st.feats))
			for r, f := range st.feats {
				c.PredictedSeconds[r] = cal.Predict(f, l.placement)
			}
		}
		lv.Steps[i] = c
	}
	return &LiveReport{Report: rep, Mixture: mix, Live: lv}
}

// NewRates is the throughput of st.
func NewRates(st Stats) Rates {
	r := Rates{Stats: st}
	if st.ElapsedSeconds > 0 {
		r.SamplesPerSecond = float64(st.Samples) / st.ElapsedSeconds
		r.BytesPerSecond = float64(st.Bytes) / st.ElapsedSeconds
	}
	return r
}

// Imbalance is max/mean (1 for an empty or all-zero step).
func Imbalance(costs []float64) float64 {
	var sum, top float64
	for _, c := range costs {
		sum += c
		top = max(top, c)
	}
	if sum <= 0 {
		return 1
	}
	return top * float64(len(costs)) / sum
}

// planningStatus says why snapshot has no report: no epoch yet, or how far
// the current epoch's plan is.
func (l *State) PlanningStatus() string {
	l.mu.Lock()
	ep := l.ep
	l.mu.Unlock()
	if ep == nil {
		return "no epoch planned yet"
	}
	planned, total, _, err := ep.Planning()
	if err != nil {
		return fmt.Sprintf("epoch %d: planning failed: %v", ep.Info().Epoch, err)
	}
	if planned < total {
		return fmt.Sprintf("epoch %d: planning %d/%d steps (the report follows the whole plan)", ep.Info().Epoch, planned, total)
	}
	return fmt.Sprintf("epoch %d: planned %d/%d steps, building the strategy comparison", ep.Info().Epoch, planned, total)
}
