package pipeline

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/mmfeed/mmfeed/balancer"
)

// CostModelExport is the cost-model file `serve` writes (--cost-model-out, GET
// /v1/cost-model) and `report`/`shard`/`serve` read (--cost-model): the model in effect,
// and the calibration it came from when trainer feedback fitted it.
type CostModelExport struct {
	Model balancer.CostModel `json:"model"`
	// Fitted is false while the model is still the prior (no fit yet).
	Fitted       bool                  `json:"fitted"`
	Observations int                   `json:"observations"`
	Calibration  *balancer.Calibration `json:"calibration,omitempty"`
}

// LoadCostModel reads a cost-model file: a CostModelExport, or a bare balancer.CostModel
// ({"coefficients": ..., "unit": ...}). The model is validated.
func LoadCostModel(path string) (balancer.CostModel, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return balancer.CostModel{}, fmt.Errorf("pipeline: cost model: %w", err)
	}
	return ParseCostModel(path, b)
}

// ParseCostModel parses the content b of a cost-model file (name is for errors).
func ParseCostModel(path string, b []byte) (balancer.CostModel, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil {
		return balancer.CostModel{}, fmt.Errorf("pipeline: cost model %s: %w", path, err)
	}
	var m balancer.CostModel
	raw := b
	if inner, ok := probe["model"]; ok {
		raw = inner
	} else if _, ok := probe["coefficients"]; !ok {
		return m, fmt.Errorf("pipeline: cost model %s: no \"model\" or \"coefficients\" key", path)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("pipeline: cost model %s: %w", path, err)
	}
	if err := m.Validate(); err != nil {
		return m, fmt.Errorf("pipeline: cost model %s: %w", path, err)
	}
	return m, nil
}

// WriteCostModel writes e to path atomically (a reader never sees half a file).
func WriteCostModel(path string, e CostModelExport) error {
	b, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".cost-model-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
