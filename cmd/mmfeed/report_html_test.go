package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mmfeed/mmfeed/internal/browsertest"
	"github.com/mmfeed/mmfeed/internal/reportcheck"
)

// mmfeed runs the binary's entry point in-process and fails the test on a
// non-zero exit.
func mmfeed(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("mmfeed %s: exit %d: %s", strings.Join(args, " "), code, errb.String())
	}
	return out.String()
}

// TestStaticReportInBrowser opens the report.html that `mmfeed shard` writes,
// and the one `mmfeed report --html` writes, in headless Chromium: every number
// the rendered page shows equals report.json (the --json output), the
// thumbnails decode, and nothing is fetched from elsewhere.
func TestStaticReportInBrowser(t *testing.T) {
	b := browsertest.New(t)
	dir := t.TempDir()
	mmfeed(t, "synth", "--out", filepath.Join(dir, "corpus"), "--samples", "160", "--seed", "5", "--bad-fraction", "0.05")
	input := filepath.Join(dir, "corpus", "manifest.jsonl")
	job := []string{"--input", input, "--dp", "4", "--global-batch", "32", "--image-size", "32", "--workers", "2"}
	shards := filepath.Join(dir, "shards")
	mmfeed(t, append([]string{"shard", "--out", shards}, job...)...)
	page := filepath.Join(dir, "report.html")
	js := mmfeed(t, append([]string{"report", "--json", "--html", page}, job...)...)

	for _, tc := range []struct {
		name, page string
		json       []byte
	}{
		{"shard", filepath.Join(shards, "report.html"), readFile(t, filepath.Join(shards, "report.json"))},
		{"report --html", page, []byte(js)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b.Open("file://" + tc.page)
			dom := b.DOM()
			n, err := reportcheck.Compare(dom, tc.json)
			if err != nil {
				t.Fatal(err)
			}
			if n < 35 {
				t.Errorf("only %d numbers on the page", n)
			}
			for _, want := range []string{"quarantine_reasons.", "heaviest", "aspect"} {
				if !strings.Contains(dom, want) {
					t.Errorf("page lacks %q", want)
				}
			}
			if got := b.EvalString(`String(document.images.length) + " " + Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)`); got != "12 true" {
				t.Errorf("thumbnails (count, all decoded): %s, want 12 true", got)
			}
			if got := b.EvalString(`performance.getEntriesByType("resource").map(e => e.name).filter(u => !u.startsWith("data:")).join(" ")`); got != "" {
				t.Errorf("the page fetched %s", got)
			}
			b.Screenshot("report-static-" + strings.ReplaceAll(tc.name, " ", "") + ".png")
		})
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
