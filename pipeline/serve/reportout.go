package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline"
)

// The run report (Config.ReportOut, `serve --report-out DIR`) is what the
// live report says, kept after the run: the `mmfeed report` JSON and HTML of
// an epoch (its strategy comparison), the live section as /v1/report has it,
// and "run": the measured figures of every epoch so far (runRecord). Files,
// each written atomically (a temporary file in DIR, then a rename):
//
//   - report-e<epoch>.json and report-e<epoch>.html, once every rank has
//     trained past the epoch (checked every reportEvery), and at exit for
//     every epoch not written yet (with what it has then);
//   - report-latest.json and report-latest.html, the newest of those, and
//     rewritten when Run returns: the job's end, an error, SIGTERM or ctx.

// reportEvery is how often the run report checks for finished epochs.
var reportEvery = time.Second // a variable so tests can shorten it

// Reasons a run report file was written.
const (
	reasonEpochEnd = "epoch_end"
	reasonExit     = "exit"
)

// RunReport is one --report-out JSON file.
type RunReport struct {
	// Report is the epoch's strategy comparison (`mmfeed report --json`),
	// absent when no epoch was planned; its quarantine counts are the epoch's.
	*balancer.Report
	// Mixture is a mixture epoch's per-source lines (/v1/report's
	// "mixture"), with Report; absent for a plain input.
	Mixture *pipeline.MixtureReport `json:"mixture,omitempty"`
	Live    Live                    `json:"live"`
	Run     RunSummary              `json:"run"`
}

// RunSummary is what the trainers did, as the service saw it.
type RunSummary struct {
	Job string `json:"job"`
	// Epoch is the epoch the file is about; Reason is "epoch_end" (every
	// rank trained past it) or "exit" (Run returned).
	Epoch     int       `json:"epoch"`
	Reason    string    `json:"reason"`
	WrittenAt time.Time `json:"written_at"`
	// StepsTotal is the job's step count (its epochs' planned steps, the
	// current epoch's count for those not planned yet); StepsPublished and
	// StepsTrained as in Live.
	StepsTotal         int  `json:"steps_total"`
	StepsPublished     int  `json:"steps_published"`
	StepsTrained       int  `json:"steps_trained"`
	FinishedPublishing bool `json:"finished_publishing"`
	FinishedTraining   bool `json:"finished_training"`
	// Epochs are the measured figures of every epoch this service published
	// steps of, in epoch order.
	Epochs []EpochMeasured `json:"epochs"`
}

// EpochMeasured is one epoch's measured figures.
type EpochMeasured struct {
	Epoch int `json:"epoch"`
	// Steps is the epoch's planned step count (0: unknown); StepsPublished
	// counts the steps this service published (a republished step once);
	// StepsTrained those every rank acknowledged; StepsMeasured those every
	// rank reported a step time for; StepsIncomplete those some rank never
	// reported (forgotten after maxPendingSteps newer ones).
	Steps           int `json:"steps"`
	StepsPublished  int `json:"steps_published"`
	StepsTrained    int `json:"steps_trained"`
	StepsMeasured   int `json:"steps_measured"`
	StepsIncomplete int `json:"steps_incomplete"`
	// MeasuredImbalance is max/mean of the dp ranks' measured step times,
	// over the measured steps; PredictedImbalance is the plan's max/mean of
	// the rank costs over the same steps; PlannedImbalance the plan's over
	// every published step.
	MeasuredImbalance  ImbalanceStats `json:"measured_imbalance"`
	PredictedImbalance ImbalanceStats `json:"predicted_imbalance"`
	PlannedImbalance   ImbalanceStats `json:"planned_imbalance"`
	// Ranks are the dp ranks' step times over the measured steps (a dp
	// rank's time is its slowest mp rank's).
	Ranks []RankMeasured `json:"ranks"`
	// Quarantined counts the epoch's quarantined samples by reason.
	Quarantined map[string]int64 `json:"quarantined"`
}

// ImbalanceStats summarises per-step imbalances (max/mean, 1 is perfect).
type ImbalanceStats struct {
	Steps int     `json:"steps"`
	Mean  float64 `json:"mean"`
	Max   float64 `json:"max"`
}

// RankMeasured is one dp rank's measured step times.
type RankMeasured struct {
	DP                  int     `json:"dp"`
	Steps               int     `json:"steps"`
	MeanSeconds         float64 `json:"mean_seconds"`
	MaxSeconds          float64 `json:"max_seconds"`
	TotalSeconds        float64 `json:"total_seconds"`
	MeanDataWaitSeconds float64 `json:"mean_data_wait_seconds"`
}

// reportOut writes the run report files; it remembers the epochs written and
// each epoch's comparison once seen (a plan is released two epochs later).
type reportOut struct {
	mu      sync.Mutex
	dir     string
	views   *liveViews
	written map[int]bool
	reports map[int]*balancer.Report
	mixes   map[int]*pipeline.MixtureReport // a mixture epoch's per-source lines, beside reports
}

// openReportOut creates Config.ReportOut; nil without one.
func (s *Service) openReportOut() (*reportOut, error) {
	if s.cfg.ReportOut == "" {
		return nil, nil
	}
	if err := os.MkdirAll(s.cfg.ReportOut, 0o755); err != nil {
		return nil, fmt.Errorf("serve: --report-out: %w", err)
	}
	return &reportOut{dir: s.cfg.ReportOut, views: &liveViews{cal: s.cal}, written: map[int]bool{}, reports: map[int]*balancer.Report{},
		mixes: map[int]*pipeline.MixtureReport{}}, nil
}

// reportLoop writes each epoch's files once every rank trained past it,
// until ctx ends.
func (s *Service) reportLoop(ctx context.Context, ro *reportOut) {
	t := time.NewTicker(reportEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			ro.epochEnds(s)
		}
	}
}

// epochEnds writes the files of every epoch the trainers finished since the
// last call.
func (ro *reportOut) epochEnds(s *Service) {
	ro.mu.Lock()
	defer ro.mu.Unlock()
	ro.remember(s)
	p, ok := s.ranks.Trained()
	if !ok {
		return
	}
	for _, e := range s.live.record.epochList() { // the epochs this service published
		if e < p.Epoch && !ro.written[e] {
			ro.write(s, e, reasonEpochEnd, true)
		}
	}
}

// exitMeasureWait bounds how long the exit waits for the step times of
// steps every rank acknowledged but not every rank has reported yet (a
// last feedback still in flight beside the done that ended the job).
const exitMeasureWait = time.Second

// atExit writes every epoch not written yet and the latest files with
// reason "exit"; Run calls it after its parts stopped, while the control
// handlers still take feedback.
func (ro *reportOut) atExit(s *Service) {
	ro.mu.Lock()
	defer ro.mu.Unlock()
	ro.remember(s)
	p, _ := s.ranks.Trained()
	for deadline := time.Now().Add(exitMeasureWait); s.live.record.partialBefore(p) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cur, ok := s.live.currentEpoch()
	if !ok {
		cur = s.cfg.Pipeline.Plan.Epoch
	}
	epochs := append(s.live.record.epochList(), cur)
	slices.Sort(epochs)
	for _, e := range slices.Compact(epochs) {
		if !ro.written[e] {
			reason := reasonExit
			if e < p.Epoch {
				reason = reasonEpochEnd
			}
			ro.write(s, e, reason, true)
		}
	}
	ro.write(s, cur, reasonExit, false) // last: report-latest is the current epoch's, at exit
}

// remember keeps the comparisons of the epochs held in memory (the current
// one and its neighbours). Caller holds ro.mu.
func (ro *reportOut) remember(s *Service) {
	cur, _ := s.live.currentEpoch()
	for e := max(cur-1, s.cfg.Pipeline.Plan.Epoch); e <= min(cur+1, s.cfg.lastEpoch()); e++ {
		if ro.reports[e] != nil {
			continue
		}
		if ep := s.epochs.Plan(e); ep != nil {
			if _, _, rep, _ := ep.Planning(); rep != nil {
				ro.reports[e], ro.mixes[e] = rep, ep.MixtureReport()
			}
		}
	}
	for e := range ro.reports { // keep two epochs before the current one
		if e < cur-2 && ro.written[e] {
			delete(ro.reports, e)
			delete(ro.mixes, e)
		}
	}
}

// write writes the latest files and, with epochFile, epoch e's. Caller holds ro.mu.
func (ro *reportOut) write(s *Service, e int, reason string, epochFile bool) {
	rr := s.runReport(e, reason, ro.reports[e], ro.mixes[e])
	js, err := json.MarshalIndent(rr, "", "  ")
	if err == nil {
		var page bytes.Buffer
		if err = writeRunHTML(&page, rr, ro.views.liveView(rr.Report, rr.Live)); err == nil {
			js = append(js, '\n')
			bases := []string{"report-latest"}
			if epochFile {
				bases = append([]string{fmt.Sprintf("report-e%d", e)}, bases...)
			}
			for _, base := range bases {
				if err = writeAtomic(filepath.Join(ro.dir, base+".json"), js); err != nil {
					break
				}
				if err = writeAtomic(filepath.Join(ro.dir, base+".html"), page.Bytes()); err != nil {
					break
				}
			}
		}
	}
	if err != nil {
		s.log.Warn("run report not written", "dir", ro.dir, "epoch", e, "err", err)
		return
	}
	ro.written[e] = ro.written[e] || epochFile
	s.log.Info("run report written", "dir", ro.dir, "epoch", e, "reason", reason,
		"steps_trained", rr.Run.StepsTrained, "steps_published", rr.Run.StepsPublished)
}

// runReport assembles epoch e's file: rep is e's comparison and mix its
// mixture lines when known (else the live report's).
func (s *Service) runReport(e int, reason string, rep *balancer.Report, mix *pipeline.MixtureReport) RunReport {
	snap := s.liveSnapshot(true)
	rr := RunReport{Live: snap.Live}
	if rep == nil {
		rep, mix = snap.Report, snap.Mixture
	}
	if rep != nil {
		c := *rep
		c.QuarantineReasons = s.live.quarantineGroups(c.Epoch)
		c.Quarantined = 0
		for _, g := range c.QuarantineReasons {
			c.Quarantined += int(g.Count)
		}
		rr.Report, rr.Mixture = &c, mix
	}
	trained, ok := s.ranks.Trained()
	if !ok {
		trained = pos{Epoch: s.cfg.Pipeline.Plan.Epoch, Step: 0}
	}
	sum := RunSummary{Job: s.cfg.Job, Epoch: e, Reason: reason, WrittenAt: time.Now().UTC(),
		StepsPublished: s.live.publishedSteps(), StepsTrained: s.stepsTrained(), FinishedPublishing: s.finishedPublishing(),
		FinishedTraining: !trained.Less(pos{Epoch: s.cfg.lastEpoch() + 1, Step: 0})}
	for _, em := range s.live.record.summary() {
		em.Steps = s.epochs.Steps(em.Epoch)
		em.StepsTrained = epochTrained(trained, em.Epoch, em.Steps)
		em.Quarantined = s.live.quarantineCounts(em.Epoch)
		sum.Epochs = append(sum.Epochs, em)
	}
	sum.StepsTotal = s.stepsTotal()
	rr.Run = sum
	return rr
}

// epochTrained is how many of epoch e's steps are before trained.
func epochTrained(trained pos, e, steps int) int {
	switch {
	case trained.Epoch > e:
		return steps
	case trained.Epoch == e:
		return min(trained.Step, steps)
	}
	return 0
}

// stepsTrained counts the steps every rank acknowledged, over the job's
// epochs (0 until every rank registered).
func (s *Service) stepsTrained() int {
	p, ok := s.ranks.Trained()
	if !ok {
		return 0
	}
	n := 0
	for e := s.cfg.Pipeline.Plan.Epoch; e <= s.cfg.lastEpoch() && e <= p.Epoch; e++ {
		n += epochTrained(p, e, s.epochs.Steps(e))
	}
	return n
}

// stepsTotal is the job's step count: the planned epochs' counts, and the
// latest planned count for the epochs not planned yet.
func (s *Service) stepsTotal() int {
	n, last := 0, 0
	for e := s.cfg.Pipeline.Plan.Epoch; e <= s.cfg.lastEpoch(); e++ {
		if st := s.epochs.Steps(e); st > 0 {
			last = st
		}
		n += max(s.epochs.Steps(e), last)
	}
	return n
}

// writeAtomic writes b to path through a temporary file in its directory.
func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".report-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o644); err != nil { // CreateTemp's 0600 would hide the report from its readers
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
