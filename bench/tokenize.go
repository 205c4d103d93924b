package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/mmfeed/mmfeed/tokenize"
)

// benchTokenize: captions per second, bert-base-uncased with truncation at 128, one thread,
// this package's Encode loop against Python tokenizers' encode_batch (RAYON_NUM_THREADS=1)
// on the same captions: the real corpus captions when MMFEED_CORPUS is set, else the
// parity-test corpus (stdlib docstrings and mixed-script sentences).
func benchTokenize(env *benchEnv) (map[string]float64, error) {
	texts, src, err := benchCaptions(env)
	if err != nil {
		return nil, err
	}
	tk, err := tokenize.Open(tokenize.Config{MaxLength: 128, AddSpecialTokens: true, Workers: 1})
	if err != nil {
		return nil, err
	}
	defer tk.Close()
	const repeat = 3
	tk.EncodeBatch(texts[:min(256, len(texts))])
	start := time.Now()
	for range repeat {
		if _, _, err := tk.EncodeBatch(texts); err != nil {
			return nil, err
		}
	}
	goRate := float64(len(texts)*repeat) / time.Since(start).Seconds()

	inp := filepath.Join(env.tmp, "captions.jsonl")
	if err := writeTexts(inp, texts); err != nil {
		return nil, err
	}
	cmd := exec.Command("taskset", "-c", "0", env.python, "tokenize/testdata/peer.py", "bench", tk.Path(), "128", inp, fmt.Sprint(repeat))
	cmd.Env = append(os.Environ(), "RAYON_NUM_THREADS=1", "TOKENIZERS_PARALLELISM=false")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("python peer: %w", err)
	}
	var py struct {
		Rate float64 `json:"captions_per_s"`
	}
	if err := json.Unmarshal(out, &py); err != nil {
		return nil, fmt.Errorf("python peer output %q: %w", out, err)
	}
	fmt.Printf("   %d captions from %s\n", len(texts), src)
	return map[string]float64{
		"tokenize_captions_per_s":    goRate,
		"tokenize_hf_captions_per_s": py.Rate,
		"tokenize_vs_hf":             goRate / py.Rate,
	}, nil
}

func benchCaptions(env *benchEnv) ([]string, string, error) {
	path := filepath.Join(env.corpus, "dev", "manifest.jsonl")
	if env.corpus == "" {
		path = filepath.Join(env.tmp, "texts.jsonl")
		if out, err := exec.Command(env.python, "tokenize/testdata/peer.py", "corpus", path, "--min", "10000").CombinedOutput(); err != nil {
			return nil, "", fmt.Errorf("peer corpus: %v\n%s", err, out)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	var texts []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var r struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			texts = append(texts, r.Text)
		}
	}
	return texts, path, sc.Err()
}

func writeTexts(path string, texts []string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, t := range texts {
		enc.Encode(map[string]string{"text": t})
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}
