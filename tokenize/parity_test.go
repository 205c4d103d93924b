package tokenize

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/mmfeed/mmfeed/internal/testpeer"
)

func runPy(t *testing.T, py string, args ...string) {
	t.Helper()
	cmd := exec.Command(py, append([]string{"testdata/peer.py"}, args...)...)
	cmd.Env = append(os.Environ(), "TOKENIZERS_PARALLELISM=true")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("peer.py %v: %v\n%s", args[0], err, out)
	}
}

func readJSONL[T any](t *testing.T, path string) []T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestParityWithPython encodes the same >=10,000 texts (stdlib docstrings, twelve scripts,
// odd bytes, multi-megabyte captions; plus the real fortunes when MMFEED_CORPUS points at
// a built shared corpus) with this package and with the Python `tokenizers` package, for
// WordPiece (BERT, and MiniLM whose file asks for padding and 256-token truncation, both overridden) and byte-level BPE (Cohere, Llama 3) models, and
// requires identical ids for every text, and CountBatch to give the length of each.
func TestParityWithPython(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	py := testpeer.Python(t)
	dir := t.TempDir()
	corpus := filepath.Join(dir, "texts.jsonl")
	args := []string{"corpus", corpus, "--min", "10000"}
	if c := os.Getenv("MMFEED_CORPUS"); c != "" {
		args = append(args, "--real", filepath.Join(c, "text"))
	}
	runPy(t, py, args...)
	type rec struct {
		Text string `json:"text"`
	}
	recs := readJSONL[rec](t, corpus)
	texts := make([]string, len(recs))
	for i, r := range recs {
		texts[i] = r.Text
	}
	if len(texts) < 10000 {
		t.Fatalf("corpus has %d texts, want >= 10000", len(texts))
	}
	models := []string{"bert-base-uncased.json", "all-minilm-l6-v2.json", "cohere-tokenizer.json", "Meta-Llama-3-8B-Instruct.json"}
	for _, m := range models {
		t.Run(m, func(t *testing.T) {
			tk := open(t, m, 128)
			got, errs, err := tk.EncodeBatch(texts)
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range errs {
				if e != nil {
					t.Fatalf("text %d: %v", i, e)
				}
			}
			out := filepath.Join(dir, m+".ids.jsonl")
			runPy(t, py, "encode", filepath.Join(modelDir(t), m), "128", corpus, out)
			want := readJSONL[[]int32](t, out)
			if len(want) != len(texts) {
				t.Fatalf("peer returned %d encodings for %d texts", len(want), len(texts))
			}
			match := 0
			for i := range texts {
				if slices.Equal(got[i], want[i]) {
					match++
				} else if match+10 > i { // show the first few mismatches
					t.Errorf("text %d %.60q:\n go %v\n py %v", i, texts[i], got[i], want[i])
				}
			}
			counts, cerrs, err := tk.CountBatch(texts)
			if err != nil {
				t.Fatal(err)
			}
			for i := range texts {
				if cerrs[i] != nil || counts[i] != len(want[i]) {
					t.Fatalf("text %d %.60q: CountBatch %d (%v), want %d", i, texts[i], counts[i], cerrs[i], len(want[i]))
				}
			}
			t.Logf("%s: %d/%d texts identical (%.2f%%)", m, match, len(texts), 100*float64(match)/float64(len(texts)))
			if match != len(texts) {
				t.Errorf("match rate %.4f, want 1", float64(match)/float64(len(texts)))
			}
		})
	}
}
