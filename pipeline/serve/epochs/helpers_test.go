package epochs

import (
	"testing"

	"github.com/mmfeed/mmfeed/loader/synth/synthtest"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/mmfeed/mmfeed/pipeline"
)

// corpus is synthtest.Corpus: n generated samples, 5% of them bad.
func corpus(t testing.TB, n int) string { return synthtest.Corpus(t, n) }

// testConfig plans input for dp colocated ranks with small images (what
// serve's test configuration gives an epoch).
func testConfig(t testing.TB, input string, dp int) Config {
	t.Helper()
	pc := pipeline.DefaultConfig()
	pc.Input = input
	pc.Plan.DP, pc.Plan.MicroBatches, pc.Plan.GlobalBatch = dp, 2, 4*dp
	pl, err := balancer.ParsePlacement("colocated")
	if err != nil {
		t.Fatal(err)
	}
	pc.Plan.Placement = pl
	pc.Image.Size, pc.Image.PatchSize = 32, 16
	pc.Workers = 2
	return Config{Pipeline: pc, Job: "job-1", Logger: testnats.Logger(t)}
}
