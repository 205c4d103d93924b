package serve

import (
	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline"
)

// costModel is the cost model in effect: the latest fit to trainer feedback, else the prior.
func (s *Service) costModel() pipeline.CostModelExport {
	cal, n := s.cal.snapshot()
	if cal == nil {
		return pipeline.CostModelExport{Model: s.cal.prior, Observations: n}
	}
	return pipeline.CostModelExport{Model: cal.Model, Fitted: true, Observations: n, Calibration: cal}
}

// writeCostModel writes a planner refit to --cost-model-out (called with the calibrator's
// lock held: it only writes a small file).
func (s *Service) writeCostModel(cal balancer.Calibration, n int) {
	if s.cfg.CostModelOut == "" {
		return
	}
	e := pipeline.CostModelExport{Model: cal.Model, Fitted: true, Observations: n, Calibration: &cal}
	if err := pipeline.WriteCostModel(s.cfg.CostModelOut, e); err != nil {
		s.log.Warn("cost model not written", "path", s.cfg.CostModelOut, "err", err)
	}
}
