package work

import (
	"encoding/json"
	"testing"

	"github.com/mmfeed/mmfeed/proto"
)

// TestWorkSampleCarriesThePlannedRow: a batch item carries every field of a
// planned row (pipeline.PlannedRow) over the wire, so the worker
// preprocesses the row the planner planned.
func TestWorkSampleCarriesThePlannedRow(t *testing.T) {
	tests := []struct {
		name string
		row  proto.Row
	}{
		{"real sample", proto.Row{ID: "s-1", TextTokens: 17, ImageTokens: 196, Cost: 3.25, Weight: 1}},
		{"padding copy", proto.Row{ID: "s-2", TextTokens: 1, ImageTokens: 4, Cost: 0.5, Weight: 0}},
		{"text only", proto.Row{ID: "ünï", TextTokens: 512, Cost: 1e-3, Weight: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(SampleOf(tc.row))
			if err != nil {
				t.Fatal(err)
			}
			var s Sample
			if err := json.Unmarshal(b, &s); err != nil {
				t.Fatal(err)
			}
			if got := s.row(); got.ID != tc.row.ID || got.TextTokens != tc.row.TextTokens || got.ImageTokens != tc.row.ImageTokens ||
				got.Cost != tc.row.Cost || got.Weight != tc.row.Weight {
				t.Errorf("got %+v, want %+v", got, tc.row)
			}
		})
	}
}
