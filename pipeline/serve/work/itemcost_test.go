package work

import (
	"image"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/pipeline"
)

// costOf sorts megapixels by format.
func TestCostOfByFormat(t *testing.T) {
	feats := pipeline.NewFeatures([]loader.Entry{{ImageSize: 500_000}, {ImageSize: 2_000_000}}, make([]balancer.Item, 2),
		[]image.Point{{1000, 1000}, {2000, 1000}}, []string{imgproc.FormatJPEG, imgproc.FormatPNG})
	f := &feats
	got := costOf(f, []balancer.Entry{{Item: 0}, {Item: 1}, {Item: 1}})
	if want := (balancer.WorkCost{1, 4, 4.5, 3}); got != want {
		t.Errorf("cost %v, want %v", got, want)
	}
}
