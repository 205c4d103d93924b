package scalesim

import "testing"

// TestCheckFindsMissingRepeatedAndForeign: the exactly-once check fails on
// a sample missing, delivered twice, or not in the corpus, and on an epoch
// short.
func TestCheckFindsMissingRepeatedAndForeign(t *testing.T) {
	want := []string{"a", "b", "c"}
	for _, tt := range []struct {
		name   string
		got    []map[string]int
		epochs int
		ok     bool
	}{
		{"exact", []map[string]int{{"a": 1, "b": 1, "c": 1}}, 1, true},
		{"missing", []map[string]int{{"a": 1, "b": 1}}, 1, false},
		{"repeated", []map[string]int{{"a": 1, "b": 2, "c": 1}}, 1, false},
		{"foreign", []map[string]int{{"a": 1, "b": 1, "c": 1, "x": 1}}, 1, false},
		{"an epoch short", []map[string]int{{"a": 1, "b": 1, "c": 1}}, 2, false},
		{"second epoch missing one", []map[string]int{{"a": 1, "b": 1, "c": 1}, {"a": 1, "c": 1}}, 2, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := (&Result{Delivered: tt.got}).Check(want, tt.epochs)
			if (err == nil) != tt.ok {
				t.Errorf("Check: %v, want ok %v", err, tt.ok)
			}
		})
	}
}
