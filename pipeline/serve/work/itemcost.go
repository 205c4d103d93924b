package work

import (
	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/pipeline"
)

// costOf is the work cost (balancer.WorkCost: what a batch item's CPU time on a
// worker depends on) of entries of f.
func costOf(f *pipeline.Features, mb []balancer.Entry) balancer.WorkCost {
	var x balancer.WorkCost
	for _, e := range mb {
		sz := f.Sizes[e.Item]
		mp := float64(sz.X) * float64(sz.Y) / 1e6
		if f.Format(int(e.Item)) == imgproc.FormatJPEG {
			x[balancer.WorkJPEGMP] += mp
		} else {
			x[balancer.WorkOtherMP] += mp
		}
		x[balancer.WorkMB] += float64(f.ImageSize(int(e.Item))) / 1e6
		x[balancer.WorkSamples]++
	}
	return x
}
