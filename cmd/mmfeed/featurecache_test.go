package main

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// mmfeedErr runs the command and returns its stdout and stderr.
func mmfeedErr(t *testing.T, args ...string) (string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("mmfeed %s: exit %d: %s", strings.Join(args, " "), code, errb.String())
	}
	return out.String(), errb.String()
}

// shard and report share --feature-cache: the second run on the same data
// reads the features (and writes the same files), another --max-length
// computes them again, --feature-cache off never reads it.
func TestFeatureCacheFlag(t *testing.T) {
	dir := t.TempDir()
	mmfeed(t, "synth", "--out", filepath.Join(dir, "corpus"), "--samples", "60", "--seed", "4", "--bad-fraction", "0.1")
	cache := filepath.Join(dir, "features")
	job := []string{"--input", filepath.Join(dir, "corpus", "manifest.jsonl"), "--dp", "2", "--global-batch", "8",
		"--image-size", "32", "--workers", "2", "--feature-cache", cache}
	const hit = "features from the cache"
	for i, tc := range []struct {
		args   []string
		cached bool
	}{
		{[]string{"shard", "--out", filepath.Join(dir, "a")}, false},
		{[]string{"shard", "--out", filepath.Join(dir, "b")}, true},
		{[]string{"report", "--json"}, true},
		{[]string{"report", "--json", "--max-length", "16"}, false},
		{[]string{"report", "--json", "--max-length", "16"}, true},
		{[]string{"report", "--json", "--feature-cache", "off"}, false},
	} {
		_, stderr := mmfeedErr(t, append(append([]string{}, tc.args[0]), append(job, tc.args[1:]...)...)...)
		if got := strings.Contains(stderr, hit); got != tc.cached {
			t.Errorf("run %d (%v): features from the cache %v, want %v: %s", i, tc.args, got, tc.cached, stderr)
		}
	}
	a, b := files(t, filepath.Join(dir, "a")), files(t, filepath.Join(dir, "b"))
	for _, name := range []string{"/plan.jsonl", "/quarantine.jsonl"} { // the quarantine in any order
		if len(a[name]) == 0 || !slices.Equal(sortedLines(a[name]), sortedLines(b[name])) {
			t.Errorf("%s differs between the computed and the cached run", name)
		}
	}
}

func sortedLines(b []byte) []string {
	l := strings.Split(string(b), "\n")
	slices.Sort(l)
	return l
}
