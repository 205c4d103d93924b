package serve

import (
	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/pipeline"
)

// itemCost is a batch item's balancer.WorkCost: what its CPU time on a
// worker depends on.
type itemCost balancer.WorkCost

// The dimensions of an itemCost (balancer.WorkCost).
const (
	costJPEGMP  = balancer.WorkJPEGMP
	costOtherMP = balancer.WorkOtherMP
	costMB      = balancer.WorkMB
	costSamples = balancer.WorkSamples
	costDims    = balancer.WorkDims
)

// costNames name the dimensions on /metrics and in WorkTimes.
var costNames = balancer.WorkCostNames

// costOf is the cost vector of entries of f.
func costOf(f *pipeline.Features, mb []balancer.Entry) itemCost {
	var x itemCost
	for _, e := range mb {
		sz := f.Sizes[e.Item]
		mp := float64(sz.X) * float64(sz.Y) / 1e6
		if f.Format(int(e.Item)) == imgproc.FormatJPEG {
			x[costJPEGMP] += mp
		} else {
			x[costOtherMP] += mp
		}
		x[costMB] += float64(f.ImageSize(int(e.Item))) / 1e6
		x[costSamples]++
	}
	return x
}

// units is the prior's cost of x (balancer.WorkCost.Units).
func (x itemCost) units() float64 { return balancer.WorkCost(x).Units() }

// workCostModel is the planner's balancer.WorkCostModel; coef mirrors its
// coefficients after every observation. Not safe for concurrent use
// (workPlanner holds its lock).
type workCostModel struct {
	fit  balancer.WorkCostModel
	coef itemCost
}

func (m *workCostModel) observe(x itemCost, secs float64) {
	m.fit.Observe(balancer.WorkCost(x), secs)
	m.coef = itemCost(m.fit.Coefficients())
}

func (m *workCostModel) fitted() bool { return m.fit.Fitted() }

func (m *workCostModel) predict(x itemCost) float64 { return m.fit.Predict(balancer.WorkCost(x)) }
