package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// benchQuality: does balancing cost accuracy? scripts/quality.py trains the tiny model on a
// generated, learnable corpus under random, length_grouped, mmfeed and mmfeed --pack, 3
// seeds each and the same number of samples, and measures held-out retrieval; its
// quality_* keys (docs/cost-model.md, "Accuracy") are returned as they are. The trainer runs
// on both cores (2 dp ranks); `make quality` runs this section alone.
func benchQuality(env *benchEnv) (map[string]float64, error) {
	root, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.python, filepath.Join(root, "scripts", "quality.py"),
		"--mmfeed", filepath.Join(root, "bin", "mmfeed"), "--out", filepath.Join(env.tmp, "quality"))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, "trainer")+prefixPath(os.Getenv("PYTHONPATH")))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("quality study: %w\n%s", err, stderr.String())
	}
	fmt.Print(indent(stderr.String()))
	var keys map[string]float64
	if err := json.Unmarshal(out, &keys); err != nil {
		return nil, fmt.Errorf("quality study output: %w", err)
	}
	return keys, nil
}

// indent prefixes every line of s with the section's indentation.
func indent(s string) string {
	if s == "" {
		return ""
	}
	return "   " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n   ") + "\n"
}
