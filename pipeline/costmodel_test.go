package pipeline

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
)

func TestCostModelFileRoundTrip(t *testing.T) {
	m, err := balancer.NewCostModel(balancer.TinyShape())
	if err != nil {
		t.Fatal(err)
	}
	m.Coef[1] = m.Coef[1].Scale(3)
	path := filepath.Join(t.TempDir(), "cm.json")
	if err := WriteCostModel(path, CostModelExport{Model: m, Fitted: true, Observations: 40}); err != nil {
		t.Fatal(err)
	}
	got, err := LoadCostModel(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != m {
		t.Errorf("got %+v, want %+v", got, m)
	}
}

func TestLoadCostModelRejectsBadFiles(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, body string }{
		{"not json", "{"},
		{"no model", `{"unit": "s"}`},
		{"unknown field", `{"coefficients": {}, "unit": "s", "extra": 1}`},
		{"wrong shape", `{"model": {"coefficients": {"vision": 1}, "unit": "s"}}`},
		{"array", `[1, 2]`},
	} {
		path := filepath.Join(dir, tc.name+".json")
		if err := os.WriteFile(path, []byte(tc.body), 0o644); err != nil {
			t.Fatal(err)
		}
		if m, err := LoadCostModel(path); err == nil {
			t.Errorf("%s: loaded %+v", tc.name, m)
		}
	}
	m, _ := balancer.NewCostModel(balancer.TinyShape())
	m.Coef[0][0] = -1
	neg := filepath.Join(dir, "negative.json")
	if err := WriteCostModel(neg, CostModelExport{Model: m}); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCostModel(neg); err == nil {
		t.Error("a negative coefficient loaded")
	}
	if _, err := LoadCostModel(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("a missing file loaded")
	}
}
