package pipeline

import (
	"encoding/json"
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

// FuzzParseCostModel: any file content gives a valid model or an error, never a panic.
func FuzzParseCostModel(f *testing.F) {
	m, _ := balancer.NewCostModel(balancer.TinyShape())
	good, _ := json.Marshal(CostModelExport{Model: m, Fitted: true})
	bare, _ := json.Marshal(m)
	for _, seed := range [][]byte{good, bare, []byte(`{"model": null}`), []byte(`{"coefficients": [[1e308, 1e308]]}`), []byte("[]")} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ParseCostModel("fuzz", b)
		if err == nil {
			if verr := got.Validate(); verr != nil {
				t.Fatalf("accepted an invalid model %+v: %v", got, verr)
			}
		}
	})
}
