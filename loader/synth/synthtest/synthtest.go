// Package synthtest gives tests a generated corpus: loader/synth's skewed
// image–caption samples, some of them corrupt on purpose, written under the
// test's temporary folder. It is imported by tests only.
package synthtest

import (
	"context"
	"testing"

	"github.com/mmfeed/mmfeed/loader/synth"
)

// Corpus writes n samples (seed 7, 5% of them bad) as a JSONL manifest
// under t.TempDir() and returns the manifest's path.
func Corpus(t testing.TB, n int) string {
	t.Helper()
	cfg := synth.DefaultConfig()
	cfg.Out, cfg.Samples, cfg.Seed, cfg.Format, cfg.BadFraction = t.TempDir(), n, 7, "jsonl", 0.05
	sum, err := synth.Generate(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return sum.Path
}
