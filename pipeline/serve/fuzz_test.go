package serve

import (
	"encoding/json"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
)

// FuzzEpochInfo feeds arbitrary bytes to the KV epoch-info parser (the
// bucket is shared with other processes): it must return an error or a
// valid EpochInfo, never panic.
func FuzzEpochInfo(f *testing.F) {
	m, _ := balancer.NewCostModel(balancer.TinyShape())
	good, _ := json.Marshal(EpochInfo{Epoch: 1, Steps: 10, MicroBatches: 2, PlanHash: "ab",
		Segments: []Segment{{FromStep: 0, Model: m}, {FromStep: 4, Model: m, Fit: &balancer.Fit{N: 9, R2: 0.9}}}})
	f.Add(good)
	f.Add([]byte(`{"epoch":0,"steps":3,"micro_batches":1,"plan_hash":"x","segments":[]}`))
	f.Add([]byte(`{"steps":-1}`))
	f.Add([]byte(`{"segments":[{"from_step":0,"model":{"coefficients":[[1e999]]}}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var info EpochInfo
		if err := decodeStrict(b, &info); err != nil {
			return
		}
		if err := info.Validate(); err != nil {
			return
		}
		if info.Steps < 0 || info.MicroBatches < 1 || len(info.Segments) == 0 || info.Segments[0].FromStep != 0 {
			t.Fatalf("validate accepted %+v", info)
		}
		for _, s := range info.Segments {
			if s.Model.Validate() != nil {
				t.Fatalf("validate accepted a bad model %+v", s.Model)
			}
		}
	})
}

// FuzzCount fuzzes the KV decimal parser.
func FuzzCount(f *testing.F) {
	for _, s := range []string{"0", "7", "007", "-1", "2147483647", "2147483648", "", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := parseCount(s)
		if err != nil {
			return
		}
		if v < 0 || v > 1<<31-1 || (len(s) > 1 && s[0] == '0') {
			t.Fatalf("parseCount(%q) = %d", s, v)
		}
	})
}
