package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mmfeed/mmfeed/tokenize"
)

// TestModelVocabCheckedAtPlanTime: a --model whose vocabulary is smaller
// than the tokenizer's is refused by report and shard before they index,
// not at the trainer's first step; without --model (the cost model's
// default prior) or with a model that holds the ids, the run goes on.
func TestModelVocabCheckedAtPlanTime(t *testing.T) {
	bert, err := tokenize.DefaultTokenizerPath()
	if err != nil {
		t.Skip(err)
	}
	llama := filepath.Join(filepath.Dir(bert), "Meta-Llama-3-8B-Instruct.json") // 128,256 ids; the presets embed 30,522
	if _, err := os.Stat(llama); err != nil {
		t.Skip(err)
	}
	big := filepath.Join(t.TempDir(), "big.json")
	preset, err := os.ReadFile("../../trainer/mmfeed_trainer/presets/tiny.json")
	must(t, err)
	must(t, os.WriteFile(big, bytes.Replace(preset, []byte(`"vocab_size": 30522`), []byte(`"vocab_size": 128256`), 1), 0o644))
	input := writeManifest(t, map[string][]byte{"a.png": pngBytes(t)}, `{"image":"a.png","text":"a caption"}`)
	for _, tt := range []struct {
		name  string
		extra []string
		want  string // in stderr; "": exit 0
	}{
		{"preset smaller than the tokenizer", []string{"--model", "tiny"}, "the tokenizer has 128256 ids and model tiny embeds 30522"},
		{"no --model", nil, ""},
		{"a model file that holds the ids", []string{"--model", big}, ""},
	} {
		for _, cmd := range []string{"report", "shard"} {
			t.Run(tt.name+"/"+cmd, func(t *testing.T) {
				args := append([]string{cmd, "--input", input, "--tokenizer", llama, "--dp", "1", "--global-batch", "1",
					"--micro-batches", "1", "--image-size", "32", "--feature-cache", "off"}, tt.extra...)
				if cmd == "shard" {
					args = append(args, "--out", filepath.Join(t.TempDir(), "out"))
				}
				var out, errb bytes.Buffer
				code := run(context.Background(), args, &out, &errb)
				if tt.want == "" {
					if code != 0 {
						t.Fatalf("exit %d: %s", code, errb.String())
					}
					return
				}
				if code == 0 || !strings.Contains(errb.String(), tt.want) || strings.Contains(out.String(), "samples seen") {
					t.Fatalf("exit %d, stderr %q: want non-zero with %q", code, errb.String(), tt.want)
				}
			})
		}
	}
}
