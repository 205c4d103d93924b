package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mmfeed/mmfeed/pipeline"
)

// TestMixtureFlag: --mixture loads the file with absolute source paths;
// both or neither of --input and --mixture, bad weights, unknown keys,
// missing files and URL sources fail with a clear message.
func TestMixtureFlag(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("mix.yaml", "sources:\n  - {name: a, path: a.jsonl, weight: 6, root: imgs}\n  - {path: b/shards, weight: 1, format: wds}\n")
	for _, tc := range []struct {
		name string
		args []string
		want string // "" : accepted
	}{
		{"mixture", []string{"--mixture", good}, ""},
		{"both", []string{"--mixture", good, "--input", "x.jsonl"}, "exclusive"},
		{"neither", nil, "--input (or --mixture) is required"},
		{"missing file", []string{"--mixture", filepath.Join(dir, "nope.yaml")}, "nope.yaml"},
		{"bad weight", []string{"--mixture", write("w.yaml", "sources:\n  - {path: a, weight: 0}\n")}, "weight 0"},
		{"unknown key", []string{"--mixture", write("k.yaml", "sources:\n  - {path: a, weight: 1, caption: x}\n")}, "field caption not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			j := bindJobFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			c, err := j.config()
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want one containing %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s := c.Mixture.Sources
			if len(s) != 2 || s[0].Path != filepath.Join(dir, "a.jsonl") || s[0].Root != filepath.Join(dir, "imgs") || s[1].Name != "shards" || s[1].Format != "wds" {
				t.Fatalf("sources %+v", s)
			}
		})
	}
}

// TestMixtureFlagURLSource: a source's URL path (as --input takes) stays as
// written, not made absolute as a local path; before, it was refused.
func TestMixtureFlagURLSource(t *testing.T) {
	p := filepath.Join(t.TempDir(), "u.yaml")
	urls := []string{"s3://b/x.tar", "file:///data/a/manifest.jsonl", "https://example.org/shard-{000..003}.tar"}
	body := "sources:\n"
	for i, u := range urls {
		body += "  - {name: s" + string(rune('0'+i)) + ", path: '" + u + "', weight: 1}\n"
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := loadMixture(p)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range m.Sources {
		if s.Path != urls[i] {
			t.Errorf("source %d: path %q, want %q", i, s.Path, urls[i])
		}
	}
}

// TestShardMixtureEpochs: `shard --mixture --epochs 2` writes two epoch
// indexes (the second its own draws of the mixture), says so in its summary,
// and its report.html shows the per-source lines. Before, it was refused
// ("one epoch per run").
func TestShardMixtureEpochs(t *testing.T) {
	dir := t.TempDir()
	for _, c := range [][]string{{"web", "jsonl", "60"}, {"own", "wds", "30"}} {
		mmfeed(t, "synth", "--out", filepath.Join(dir, c[0]), "--format", c[1], "--samples", c[2], "--seed", "3")
	}
	p := filepath.Join(dir, "mix.yaml")
	body := "sources:\n  - {name: web, path: web/manifest.jsonl, weight: 3}\n  - {name: own, path: own, weight: 1, cap: 10}\n"
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	stdout := mmfeed(t, "shard", "--mixture", p, "--out", out, "--epochs", "2", "--dp", "2", "--global-batch", "8",
		"--image-size", "32", "--feature-cache", "off")
	if !strings.Contains(stdout, "and 2 epoch indexes to") {
		t.Errorf("summary %q, want 2 epoch indexes", stdout)
	}
	for _, f := range []string{pipeline.IndexFile(0), pipeline.IndexFile(1), "shard.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
	page, err := os.ReadFile(filepath.Join(out, "report.html"))
	if err != nil || !strings.Contains(string(page), `data-key="mixture.sources.1.share"`) {
		t.Errorf("report.html has no per-source lines (%v)", err)
	}
}
