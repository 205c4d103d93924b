package serve

import (
	"sync"

	"github.com/mmfeed/mmfeed/balancer"
)

// maxFitPoints bounds the calibration history the report page keeps.
const maxFitPoints = 512

// reportPage serves `/`: the balance report with its live section. It keeps
// the calibration fit over time, sampled whenever the report is read (the
// page polls every two seconds while open) and the fit has new observations.
type reportPage struct {
	s   *Service
	mu  sync.Mutex
	fit []balancer.FitPoint
}

// view returns the report and its live section, or nils before the first epoch.
func (p *reportPage) view() (*balancer.Report, *balancer.LiveView) {
	r := p.s.snapshot()
	if r == nil {
		return nil, nil
	}
	l := r.Live
	lv := &balancer.LiveView{Job: l.Job, Finished: l.Finished, StepsPublished: l.StepsPublished,
		StepsTotal: l.StepsPerEpoch * (l.LastEpoch - l.FirstEpoch + 1), Samples: l.Throughput.Samples,
		ElapsedSeconds: l.Throughput.ElapsedSeconds, SamplesPerSecond: l.Throughput.SamplesPerSecond,
		Unit: r.Unit, Quarantined: l.Quarantined}
	for _, st := range l.Steps {
		lv.Steps = append(lv.Steps, balancer.LiveStepView{Epoch: st.Epoch, Step: st.Step, PredictedSeconds: st.PredictedSeconds,
			PredictedCost: st.PredictedCost, MeasuredSeconds: st.MeasuredSeconds, DataWaitSeconds: st.DataWaitSeconds})
	}
	lv.Fit = p.recordFit(l.Calibration)
	return r.Report, lv
}

// recordFit appends the calibration's fit when it covers more observations
// than the last recorded one, and returns a copy of the history.
func (p *reportPage) recordFit(c *balancer.Calibration) []balancer.FitPoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c != nil && (len(p.fit) == 0 || c.Fit.N != p.fit[len(p.fit)-1].Observations) {
		p.fit = append(p.fit, balancer.FitPoint{Observations: c.Fit.N, R2: c.Fit.R2, RelErr: c.Fit.MeanRelErr, PriorRelErr: c.Prior.MeanRelErr})
		if len(p.fit) > maxFitPoints {
			p.fit = p.fit[len(p.fit)-maxFitPoints:]
		}
	}
	return append([]balancer.FitPoint(nil), p.fit...)
}
