package main

import (
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
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

// TestShardMixtureOneEpoch: shard refuses a mixture over several epochs
// before it indexes anything (the sources here do not even exist).
func TestShardMixtureOneEpoch(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "mix.yaml")
	if err := os.WriteFile(p, []byte("sources:\n  - {path: none.jsonl, weight: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := runShard(context.Background(), []string{"--mixture", p, "--out", filepath.Join(dir, "out"), "--epochs", "2"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "one epoch per run") {
		t.Fatalf("error %v, want the one-epoch refusal", err)
	}
}
