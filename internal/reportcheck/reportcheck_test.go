package reportcheck

import (
	"strings"
	"testing"
)

func TestCompare(t *testing.T) {
	report := `{"a": 1.23456, "n": 12, "s": {"x": 1234567}, "live": {"steps": [{"epoch": 0, "step": 4, "m": [0.5, 0.25]}]}}`
	tests := []struct {
		name, page, err string
	}{
		{"printed to 4 decimals", `<td data-key="a">1.2346</td>`, ""},
		{"off in the last digit", `<td data-key="a">1.2347</td>`, "page shows"},
		{"integer", `<span data-key="n">12</span>`, ""},
		{"exponent", `<span data-key="s.x">1.23457e+06</span>`, ""},
		{"ratio sign", `<span data-key="a">1.235×</span>`, ""},
		{"live step", `<td data-key="live.step.0.4.m.1">0.2500</td>`, ""},
		{"no such live step", `<td data-key="live.step.0.5.m.1">0.2500</td>`, "no live step"},
		{"no such key", `<td data-key="b">1</td>`, `no "b"`},
		{"not a number", `<td data-key="a">n/a</td>`, "not a number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := Compare(tt.page, []byte(report))
			if n != 1 || (err == nil) != (tt.err == "") || (err != nil && !strings.Contains(err.Error(), tt.err)) {
				t.Errorf("Compare: %d, %v; want 1 value and error containing %q", n, err, tt.err)
			}
		})
	}
}
