package report

import (
	"sync"

	"github.com/mmfeed/mmfeed/balancer"
)

// fitPoints is how many prefixes of the observations the fit history refits.
const fitPoints = 24

// Views builds the report's live section as the page shows it (`/`
// and the run report's HTML). Its calibration history refits the cost
// model to growing prefixes of the trainer feedback (in arrival order), so
// the page shows how the fit evolved whenever it is opened; it is
// recomputed only when feedback arrived.
type Views struct {
	cal  ObservationSource
	mu   sync.Mutex
	n    int // observations the cached history covers
	hist []balancer.FitPoint
}

// ObservationSource is where the fit history takes the trainer feedback's
// observations: a copy of them (in arrival order), the prior, the fit
// configuration and the minimum count a fit needs.
type ObservationSource interface {
	Observations() ([]balancer.Observation, balancer.CostModel, balancer.CalibrateConfig, int)
}

// NewViews returns the live section's builder over src's observations.
func NewViews(src ObservationSource) *Views { return &Views{cal: src} }

// liveView is the page's live section of l; r gives the cost unit (nil: none).
func (p *Views) LiveView(r *balancer.Report, l Live) *balancer.LiveView {
	lv := &balancer.LiveView{Job: l.Job, Finished: l.Finished, StepsPublished: l.StepsPublished, StepsTrained: l.StepsTrained,
		StepsTotal: l.StepsPerEpoch * (l.LastEpoch - l.FirstEpoch + 1), Samples: l.Throughput.Samples,
		ElapsedSeconds: l.Throughput.ElapsedSeconds, SamplesPerSecond: l.Throughput.SamplesPerSecond,
		Quarantined: l.Quarantined}
	if r != nil {
		lv.Unit = r.Unit
	}
	for _, st := range l.Steps {
		lv.Steps = append(lv.Steps, balancer.LiveStepView{Epoch: st.Epoch, Step: st.Step, PredictedSeconds: st.PredictedSeconds,
			PredictedCost: st.PredictedCost, MeasuredSeconds: st.MeasuredSeconds, DataWaitSeconds: st.DataWaitSeconds})
	}
	lv.Fit = p.fitHistory(l.Calibration)
	return lv
}

// fitHistory returns the fit at up to fitPoints observation counts, ending
// with cur (the report's calibration) when there is one.
func (p *Views) fitHistory(cur *balancer.Calibration) []balancer.FitPoint {
	obs, prior, cfg, minObs := p.cal.Observations()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(obs) != p.n {
		p.n, p.hist = len(obs), nil
		every := max(minObs, (len(obs)+fitPoints-1)/fitPoints)
		for k := every; k < len(obs); k += every {
			if cal, err := balancer.Calibrate(prior, obs[:k], cfg); err == nil {
				p.hist = append(p.hist, fitPoint(cal))
			}
		}
	}
	out := append([]balancer.FitPoint(nil), p.hist...)
	if cur != nil {
		out = append(out, fitPoint(*cur))
	}
	return out
}

func fitPoint(c balancer.Calibration) balancer.FitPoint {
	return balancer.FitPoint{Observations: c.Fit.N, R2: c.Fit.R2, RelErr: c.Fit.MeanRelErr, PriorRelErr: c.Prior.MeanRelErr}
}
