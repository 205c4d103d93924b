package main

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInspect(t *testing.T) {
	dir := t.TempDir()
	mmfeed(t, "synth", "--out", filepath.Join(dir, "corpus"), "--samples", "80", "--seed", "2")
	shards := filepath.Join(dir, "shards")
	mmfeed(t, "shard", "--input", filepath.Join(dir, "corpus", "manifest.jsonl"), "--dp", "2", "--global-batch", "16",
		"--image-size", "32", "--workers", "2", "--out", shards)
	sheet := filepath.Join(dir, "sheet.png")
	out := mmfeed(t, "inspect", "--shards", shards, "--rank", "1", "--step", "3", "--out", sheet)
	if !strings.Contains(out, "rank 1, step 3:") {
		t.Errorf("output %q", out)
	}
	f, err := os.Open(sheet)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() < 1000 || b.Dy() < 250 {
		t.Errorf("sheet is %v", b)
	}
	page := filepath.Join(dir, "sheet.html")
	mmfeed(t, "inspect", "--shards", shards, "--rank", "1", "--step", "3", "--out", page, "--format", "html")
	if b, _ := os.ReadFile(page); bytes.Count(b, []byte("<figure>")) < 2 {
		t.Errorf("html sheet has %d samples", bytes.Count(b, []byte("<figure>")))
	}
	tests := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"no source", []string{"inspect", "--out", sheet}, 2, "either --shards or --nats with --job"},
		{"nats without job", []string{"inspect", "--nats", "nats://127.0.0.1:1", "--out", sheet}, 2, "either --shards or --nats with --job"},
		{"bad format", []string{"inspect", "--shards", shards, "--out", sheet, "--format", "gif"}, 2, "--format is png or html"},
		{"no such step", []string{"inspect", "--shards", shards, "--step", "999", "--out", sheet}, 1, "step not in the shard"},
		{"no such rank", []string{"inspect", "--shards", shards, "--rank", "7", "--out", sheet}, 1, "rank-00007.arrow"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o, e bytes.Buffer
			if code := run(context.Background(), tt.args, &o, &e); code != tt.code || !strings.Contains(e.String(), tt.msg) {
				t.Errorf("exit %d, stderr %q; want %d containing %q", code, e.String(), tt.code, tt.msg)
			}
		})
	}
}
