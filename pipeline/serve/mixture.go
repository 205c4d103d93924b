package serve

import "github.com/mmfeed/mmfeed/loader"

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
