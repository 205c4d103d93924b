package balancer

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPresetsMatchTrainer fails when balancer/presets drifts from the trainer's
// presets, the one source of truth (refresh with go generate ./balancer).
func TestPresetsMatchTrainer(t *testing.T) {
	src, err := filepath.Glob("../trainer/mmfeed_trainer/presets/*.json")
	if err != nil || len(src) == 0 {
		t.Fatalf("trainer presets: %v, %d files", err, len(src))
	}
	ours, _ := filepath.Glob("presets/*.json")
	if len(ours) != len(src) {
		t.Errorf("%d presets here, %d in the trainer: go generate ./balancer", len(ours), len(src))
	}
	for _, p := range src {
		want, _ := os.ReadFile(p)
		got, err := os.ReadFile(filepath.Join("presets", filepath.Base(p)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("presets/%s differs from %s (%v): go generate ./balancer", filepath.Base(p), p, err)
		}
	}
	for _, name := range []string{"tiny", "base", "base-8h"} {
		if _, err := Preset(name); err != nil {
			t.Errorf("preset %s: %v", name, err)
		}
	}
	if s, _ := Preset("base-8h"); s.FusionHeads != 8 || s.FusionHidden != 768 || s.VisionHidden != 768 || s.PatchSize != 16 {
		t.Errorf("base-8h = %+v, want ViT-B/16, 768-dim fusion with 8 heads", s)
	}
}

func TestParseShape(t *testing.T) {
	base, _ := os.ReadFile("presets/base.json")
	tests := []struct {
		name, edit, want string
	}{
		{"preset as is", "", ""},
		{"unknown key", `"vision_hidden": 768, "vison_layers": 3`, "unknown field"},
		{"heads do not divide", `"fusion_heads": 8`, ""},
		{"heads do not divide hidden", `"fusion_heads": 7`, "heads"},
		{"pad outside vocab", `"pad_token_id": 30522`, "pad token"},
		{"not json", `"vision_hidden": x`, "invalid character"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := string(base)
			if tt.edit != "" {
				key := tt.edit[:strings.Index(tt.edit, ":")]
				start := strings.Index(doc, key)
				end := start + strings.IndexAny(doc[start:], ",\n")
				doc = doc[:start] + tt.edit + doc[end:]
			}
			_, err := ParseShape([]byte(doc))
			if tt.want == "" {
				if err != nil {
					t.Errorf("got %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want ErrInvalidConfig containing %q", err, tt.want)
			}
		})
	}
	file := filepath.Join(t.TempDir(), "vitl14.json")
	doc := strings.Replace(string(base), `"patch_size": 16`, `"patch_size": 14`, 1)
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if s, err := Preset(file); err != nil || s.PatchSize != 14 {
		t.Errorf("Preset(%s) = %+v, %v; want patch 14", file, s, err)
	}
	if _, err := Preset("huge"); !errors.Is(err, ErrUnknownName) {
		t.Errorf("Preset(huge): %v", err)
	}
}
