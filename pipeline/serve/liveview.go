package serve

import (
	"sync"

	"github.com/mmfeed/mmfeed/balancer"
)

// fitPoints is how many prefixes of the observations the fit history refits.
const fitPoints = 24

// liveViews builds the report's live section as the page shows it (`/`
// and the run report's HTML). Its calibration history refits the cost
// model to growing prefixes of the trainer feedback (in arrival order), so
// the page shows how the fit evolved whenever it is opened; it is
// recomputed only when feedback arrived.
type liveViews struct {
	cal  observationSource
	mu   sync.Mutex
	n    int // observations the cached history covers
	hist []balancer.FitPoint
}

// observationSource is where the fit history takes the trainer feedback's
// observations: a copy of them (in arrival order), the prior, the fit
// configuration and the minimum count a fit needs.
type observationSource interface {
	Observations() ([]balancer.Observation, balancer.CostModel, balancer.CalibrateConfig, int)
}

// newLiveViews returns the live section's builder over src's observations.
func newLiveViews(src observationSource) *liveViews { return &liveViews{cal: src} }

// liveView is the page's live section of l; r gives the cost unit (nil: none).
func (p *liveViews) liveView(r *balancer.Report, l Live) *balancer.LiveView {
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
func (p *liveViews) fitHistory(cur *balancer.Calibration) []balancer.FitPoint {
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
