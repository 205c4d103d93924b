package serve

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/report"
	"github.com/mmfeed/mmfeed/proto"
)

// reportEvery is how often the run report checks for finished epochs.
var reportEvery = time.Second // a variable so tests can shorten it

// Reasons a run report file was written.
const (
	reasonEpochEnd = "epoch_end"
	reasonExit     = "exit"
)

// reportOut writes the run report files; it remembers the epochs written and
// each epoch's comparison once seen (a plan is released two epochs later).
type reportOut struct {
	mu      sync.Mutex
	dir     string
	views   *report.Views
	written map[int]bool
	due     map[int]time.Time // when an epoch's file was first due (measureWait)
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
	return &reportOut{dir: s.cfg.ReportOut, views: report.NewViews(s.cal), written: map[int]bool{}, due: map[int]time.Time{}, reports: map[int]*balancer.Report{},
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
// last call, once the epoch's step times are in (or measureWait after it
// ended).
func (ro *reportOut) epochEnds(s *Service) {
	ro.mu.Lock()
	defer ro.mu.Unlock()
	ro.remember(s)
	p, ok := s.ranks.Trained()
	if !ok {
		return
	}
	now := time.Now()
	for _, e := range s.live.EpochList() { // the epochs this service published
		if e >= p.Epoch || ro.written[e] {
			continue
		}
		if _, ok := ro.due[e]; !ok {
			ro.due[e] = now
		}
		if s.live.Unmeasured(proto.Pos{Epoch: e}, proto.Pos{Epoch: e + 1}) && now.Sub(ro.due[e]) < measureWait {
			continue
		}
		ro.write(s, e, reasonEpochEnd, true)
		delete(ro.due, e)
	}
}

// measureWait bounds how long a run report waits for the step times of
// steps every rank acknowledged and not every rank reported yet: feedback
// is published, not requested, so a rank's last one may land after its ack
// (or after the done that ended the job).
const measureWait = time.Second

// atExit writes every epoch not written yet and the latest files with
// reason "exit"; Run calls it after its parts stopped, while the control
// handlers still take feedback.
func (ro *reportOut) atExit(s *Service) {
	ro.mu.Lock()
	defer ro.mu.Unlock()
	ro.remember(s)
	p, _ := s.ranks.Trained()
	first := proto.Pos{Epoch: s.cfg.Pipeline.Plan.Epoch}
	for deadline := time.Now().Add(measureWait); s.live.Unmeasured(first, p) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cur, ok := s.live.CurrentEpoch()
	if !ok {
		cur = s.cfg.Pipeline.Plan.Epoch
	}
	epochs := append(s.live.EpochList(), cur)
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
	cur, _ := s.live.CurrentEpoch()
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
	err := report.WriteRunFiles(ro.dir, e, epochFile, rr, ro.views.LiveView(rr.Report, rr.Live))
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
func (s *Service) runReport(e int, reason string, rep *balancer.Report, mix *pipeline.MixtureReport) report.RunReport {
	snap := s.liveSnapshot(true)
	rr := report.RunReport{Live: snap.Live}
	if rep == nil {
		rep, mix = snap.Report, snap.Mixture
	}
	if rep != nil {
		rr.Report, rr.Mixture = s.live.WithEpochQuarantine(rep), mix
	}
	trained, ok := s.ranks.Trained()
	if !ok {
		trained = proto.Pos{Epoch: s.cfg.Pipeline.Plan.Epoch, Step: 0}
	}
	sum := report.RunSummary{Job: s.cfg.Job, Epoch: e, Reason: reason, WrittenAt: time.Now().UTC(),
		StepsPublished: s.live.PublishedSteps(), StepsTrained: s.stepsTrained(), FinishedPublishing: s.publisher.Finished(),
		FinishedTraining: !trained.Less(proto.Pos{Epoch: s.cfg.lastEpoch() + 1, Step: 0})}
	for _, em := range s.live.MeasuredEpochs() {
		em.Steps = s.epochs.Steps(em.Epoch)
		em.StepsTrained = epochTrained(trained, em.Epoch, em.Steps)
		em.Quarantined = s.live.QuarantineCounts(em.Epoch)
		sum.Epochs = append(sum.Epochs, em)
	}
	sum.StepsTotal = s.stepsTotal()
	rr.Run = sum
	return rr
}

// epochTrained is how many of epoch e's steps are before trained.
func epochTrained(trained proto.Pos, e, steps int) int {
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

// snapshot builds the live report (the strategy comparison of the
// current epoch, or of the one before until the current one's is built);
// nil before the first epoch's plan and comparison are complete
// (planningStatus says how far it is).
func (s *Service) snapshot() *report.LiveReport { return s.liveSnapshot(false) }

// liveSnapshot is snapshot; with anyway, before the comparison is built it
// returns the live section with a nil Report instead of nil (the run report).
func (s *Service) liveSnapshot(anyway bool) *report.LiveReport {
	cal, nobs := s.cal.snapshot()
	rep := s.live.Snapshot(cal, anyway)
	if rep == nil {
		return nil
	}
	lv := &rep.Live
	lv.Job, lv.FirstEpoch, lv.LastEpoch = s.cfg.Job, s.cfg.Pipeline.Plan.Epoch, s.cfg.lastEpoch()
	lv.Calibration, lv.Observations = cal, nobs
	lv.Finished = s.publisher.Finished()
	lv.StepsTrained = s.stepsTrained()
	for r, rs := range s.ranks.All() {
		dp, mp := r/s.cfg.MP, r%s.cfg.MP
		lv.Ranks = append(lv.Ranks, report.RankStatus{DP: dp, MP: mp, Rank: [2]int{dp, mp}, NextEpoch: rs.Next().Epoch, NextStep: rs.Next().Step,
			PublishedEpoch: rs.Cursor().Epoch, PublishedStep: rs.Cursor().Step, Generation: rs.Gen()})
	}
	lv.Throughput = report.NewRates(s.Stats())
	return rep
}

// trained returns the least position every rank's trainer still needs and
// the step count of its epoch (0 when not planned yet); ok is false before
// any rank registered.
func (s *Service) trained() (p proto.Pos, steps int, ok bool) {
	if p, ok = s.ranks.Trained(); !ok {
		return proto.Pos{}, 0, false
	}
	return p, s.epochs.Steps(p.Epoch), true
}

// logProgress logs, every interval while trainers move, how far the slowest
// rank is through its epoch, the rate and the ETA to the epoch's end.
func (s *Service) logProgress(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var m report.ProgressMeter
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			p, steps, ok := s.trained()
			if !ok || steps == 0 {
				continue
			}
			if l, moved := m.Update(p.Epoch, p.Step, steps, now); moved {
				s.log.Info("progress", l.Attrs()...)
			}
		}
	}
}
