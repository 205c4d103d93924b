package serve

import (
	"github.com/mmfeed/mmfeed/loader"
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

// entry returns the index position of the sample a batch item names: its
// id, or for a mixture's repeated draw (loader.DrawID "<id>#<k>") the
// sample it repeats. The planner's index quarantines ids that could be
// read both ways (loader.CombineIndexes), so the lookup is unambiguous.
func (d *workerDataset) entry(id string) (int, bool) {
	if j, ok := d.byID[id]; ok {
		return j, true
	}
	if d.ds.Config.Mixture == nil {
		return 0, false
	}
	base, _, ok := loader.DrawBase(id)
	if !ok {
		return 0, false
	}
	j, ok := d.byID[base]
	return j, ok
}
