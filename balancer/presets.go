package balancer

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
)

//go:generate sh -c "rm -f presets/*.json && cp ../trainer/mmfeed_trainer/presets/*.json presets/"

// presetFiles are copies of the trainer's presets (the one source of truth is
// trainer/mmfeed_trainer/presets; TestPresetsMatchTrainer fails when they drift).
//
//go:embed presets/*.json
var presetFiles embed.FS

// ParseShape decodes a preset-schema JSON document; unknown keys and invalid
// values are errors (ErrInvalidConfig).
func ParseShape(data []byte) (ModelShape, error) {
	var s ModelShape
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return s, fmt.Errorf("balancer: model shape: %v: %w", err, ErrInvalidConfig)
	}
	if dec.More() {
		return s, fmt.Errorf("balancer: model shape: data after the JSON object: %w", ErrInvalidConfig)
	}
	return s, s.Validate()
}

// Presets maps preset names (tiny, base, base-8h) to shapes.
func Presets() map[string]ModelShape {
	out := map[string]ModelShape{}
	entries, _ := presetFiles.ReadDir("presets")
	for _, e := range entries {
		out[strings.TrimSuffix(e.Name(), ".json")] = mustPreset(strings.TrimSuffix(e.Name(), ".json"))
	}
	return out
}

func mustPreset(name string) ModelShape {
	data, err := presetFiles.ReadFile("presets/" + name + ".json")
	if err != nil {
		panic(fmt.Sprintf("balancer: embedded preset %s: %v", name, err))
	}
	s, err := ParseShape(data)
	if err != nil {
		panic(fmt.Sprintf("balancer: embedded preset %s: %v", name, err))
	}
	return s
}

// PresetNames returns the preset names, sorted.
func PresetNames() []string {
	var names []string
	for k := range Presets() {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// Preset returns the named shape (case-insensitive), or for a name ending in
// ".json" the shape in that file.
func Preset(name string) (ModelShape, error) {
	if strings.HasSuffix(name, ".json") {
		data, err := os.ReadFile(name)
		if err != nil {
			return ModelShape{}, fmt.Errorf("balancer: model file: %w", err)
		}
		s, err := ParseShape(data)
		if err != nil {
			return s, fmt.Errorf("%s: %w", name, err)
		}
		return s, nil
	}
	s, ok := Presets()[strings.ToLower(strings.TrimSpace(name))]
	if !ok {
		return ModelShape{}, fmt.Errorf("balancer: model preset %q (want one of %v or a FILE.json): %w", name, PresetNames(), ErrUnknownName)
	}
	return s, nil
}
