package balancer

import (
	"fmt"
	"math"
	"slices"
)

// OutlierFactor bounds how far an observation's seconds per unit of prior
// cost may lie from the median of all observations before Calibrate leaves
// it out: real step times differ from a FLOP-based prior by a roughly
// constant factor (the device speed), so a value 100× off is a broken
// clock, a stalled rank or a forged message.
const OutlierFactor = 100

// dropOutliers returns the observations whose seconds per unit of prior
// step cost lie within OutlierFactor of the median ratio. Observations with
// no prior cost are kept (the prior cannot judge them). obs is not modified.
func dropOutliers(prior CostModel, obs []Observation, pl Placement) []Observation {
	ratios := make([]float64, 0, len(obs))
	for _, o := range obs {
		if c := pl.StepCost(prior.CostOf(o.Features)); c > 0 {
			ratios = append(ratios, o.Seconds/c)
		}
	}
	if len(ratios) == 0 {
		return obs
	}
	slices.Sort(ratios)
	med := ratios[len(ratios)/2]
	out := make([]Observation, 0, len(obs))
	for _, o := range obs {
		c := pl.StepCost(prior.CostOf(o.Features))
		if r := o.Seconds / c; c > 0 && (r > med*OutlierFactor || r < med/OutlierFactor) {
			continue
		}
		out = append(out, o)
	}
	return out
}

// check validates a refit: every coefficient and the overhead finite and
// non-negative, the fit measures finite, and its mean relative error no
// worse than twice the rescaled prior's plus 5 points (a refit may trade
// relative for absolute error, but not wildly).
func (c Calibration) check() error {
	if err := c.Model.Validate(); err != nil {
		return fmt.Errorf("balancer: refit: %v: %w", err, ErrBadFit)
	}
	if !(c.Overhead >= 0) || math.IsInf(c.Overhead, 0) {
		return fmt.Errorf("balancer: refit overhead %v: %w", c.Overhead, ErrBadFit)
	}
	if math.IsNaN(c.Fit.MeanRelErr) || math.IsInf(c.Fit.MeanRelErr, 0) || math.IsNaN(c.Fit.R2) {
		return fmt.Errorf("balancer: refit quality %+v: %w", c.Fit, ErrBadFit)
	}
	if c.Fit.MeanRelErr > 2*c.Prior.MeanRelErr+0.05 {
		return fmt.Errorf("balancer: refit error %.3g worse than the rescaled prior's %.3g: %w",
			c.Fit.MeanRelErr, c.Prior.MeanRelErr, ErrBadFit)
	}
	return nil
}
