package epochs

import (
	"github.com/mmfeed/mmfeed/pipeline"
)

// setMixture records the per-source lines of the complete base plan (nil
// for a plain input), before finish publishes the comparison.
func (g *planning) setMixture(m *pipeline.MixtureReport) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.mixture = m
}

// mixtureReport returns them (nil until recorded, and for a plain input).
func (g *planning) mixtureReport() *pipeline.MixtureReport {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mixture
}
