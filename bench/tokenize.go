package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/mmfeed/mmfeed/tokenize"
)

// benchTokenize: captions per CPU-second, bert-base-uncased with truncation at 128, one
// thread, on the same captions (the real corpus captions when MMFEED_CORPUS is set, else the
// parity-test corpus: stdlib docstrings and mixed-script sentences), this package against
// Python tokenizers' encode_batch (RAYON_NUM_THREADS=1, pinned to one core, a long-running
// tokenize/testdata/peer.py bench-serve), the two sides' passes interleaved in the same run
// (tokenizeRounds rounds, alternating which goes first). Each ratio is the median of the
// per-round ratios. Each Go pass opens a fresh Tokenizer, so its caches start empty.
//   - tokenize_vs_hf: EncodeBatch (ids as []int32) against encode_batch (ids left inside
//     the Rust Encoding objects, as before this benchmark was interleaved)
//   - tokenize_vs_hf_ids: the same against encode_batch plus reading every .ids list
//   - tokenize_count_vs_hf: CountBatch against encode_batch plus len() of each encoding
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
	inp := filepath.Join(env.tmp, "captions.jsonl")
	if err := writeTexts(inp, texts); err != nil {
		return nil, err
	}
	peer, err := startTokenizePeer(env, tk.Path(), inp)
	if err != nil {
		return nil, err
	}
	defer peer.close()
	tk.EncodeBatch(texts[:min(256, len(texts))])
	goPass := func(count bool) func() (float64, error) {
		return func() (float64, error) {
			// A fresh tokenizer per pass: its caches start empty, as in a pass that sees
			// each caption once (a warm cache would give repeats for free).
			fresh, err := tokenize.Open(tokenize.Config{MaxLength: 128, AddSpecialTokens: true, Workers: 1})
			if err != nil {
				return 0, err
			}
			defer fresh.Close()
			cpu0 := cpuTime()
			if count {
				_, _, err = fresh.CountBatch(texts)
			} else {
				_, _, err = fresh.EncodeBatch(texts)
			}
			return float64(len(texts)) / (cpuTime() - cpu0).Seconds(), err
		}
	}
	pyPass := func(mode string) func() (float64, error) { return func() (float64, error) { return peer.pass(mode) } }
	sides := []benchSide{
		{"tokenize_captions_per_cpu_s", goPass(false)},
		{"tokenize_count_captions_per_cpu_s", goPass(true)},
		{"tokenize_hf_captions_per_cpu_s", pyPass("encode")},
		{"tokenize_hf_ids_captions_per_cpu_s", pyPass("ids")},
		{"tokenize_hf_count_captions_per_cpu_s", pyPass("count")},
	}
	rates, err := interleave(sides, tokenizeRounds)
	if err != nil {
		return nil, err
	}
	fmt.Printf("   %d captions from %s\n", len(texts), src)
	out := bestRates(rates)
	out["tokenize_vs_hf"] = ratioOf(rates, "tokenize_vs_hf", "tokenize_captions_per_cpu_s", "tokenize_hf_captions_per_cpu_s")
	out["tokenize_vs_hf_ids"] = ratioOf(rates, "tokenize_vs_hf_ids", "tokenize_captions_per_cpu_s", "tokenize_hf_ids_captions_per_cpu_s")
	out["tokenize_count_vs_hf"] = ratioOf(rates, "tokenize_count_vs_hf", "tokenize_count_captions_per_cpu_s", "tokenize_hf_count_captions_per_cpu_s")
	return out, nil
}

const tokenizeRounds = 5

// tokenizePeer is a running `peer.py bench-serve`, pinned to one core.
type tokenizePeer struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startTokenizePeer(env *benchEnv, model, inp string) (*tokenizePeer, error) {
	cmd := exec.Command("taskset", "-c", "0", env.python, "tokenize/testdata/peer.py", "bench-serve", model, "128", inp)
	cmd.Env = append(os.Environ(), "RAYON_NUM_THREADS=1", "TOKENIZERS_PARALLELISM=false")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("python peer: %w", err)
	}
	return &tokenizePeer{cmd: cmd, in: in, out: bufio.NewScanner(stdout)}, nil
}

func (p *tokenizePeer) pass(mode string) (float64, error) {
	if _, err := io.WriteString(p.in, mode+"\n"); err != nil {
		return 0, fmt.Errorf("python peer: %w", err)
	}
	if !p.out.Scan() {
		return 0, fmt.Errorf("python peer exited: %v", p.out.Err())
	}
	var r struct {
		Rate float64 `json:"captions_per_cpu_s"`
	}
	if err := json.Unmarshal(p.out.Bytes(), &r); err != nil || r.Rate <= 0 {
		return 0, fmt.Errorf("python peer output %q: %v", p.out.Bytes(), err)
	}
	return r.Rate, nil
}

func (p *tokenizePeer) close() {
	p.in.Close()
	p.cmd.Wait()
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
