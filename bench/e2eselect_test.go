package main

import (
	"slices"
	"testing"
)

// TestSelectE2ECases: MMFEED_E2E_PARTS without "steps" runs no strategy
// comparison; MMFEED_E2E_CASES keeps the labels it lists.
func TestSelectE2ECases(t *testing.T) {
	cases := []e2eCase{{label: "skewed"}, {label: "flat"}, {label: "real"}}
	tests := []struct {
		parts, only string
		want        []string
	}{
		{"", "", []string{"skewed", "flat", "real"}},
		{"steps", "", []string{"skewed", "flat", "real"}},
		{"calib", "", nil},
		{"steps,calib", "real,skewed", []string{"skewed", "real"}},
		{"", "flat", []string{"flat"}},
		{"", "none", nil},
	}
	for _, tc := range tests {
		var got []string
		for _, c := range selectE2ECases(cases, tc.parts, tc.only) {
			got = append(got, c.label)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("parts %q cases %q: got %v, want %v", tc.parts, tc.only, got, tc.want)
		}
	}
}
