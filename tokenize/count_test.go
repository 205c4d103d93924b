package tokenize

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// countTexts are captions of every shape the count path must agree on: empty, blank,
// punctuation, several scripts, emoji, repeated words (the per-batch word cache), invalid
// UTF-8, NUL bytes, and texts longer than the prefix threshold.
func countTexts() []string {
	texts := []string{"", " ", "\t\n", "Hello world", "hello hello hello Hello HELLO",
		"a\xffb", "nul\x00inside", "Tous les êtres humains — 人人生而自由 🙂🙂",
		"CamelCase, digits 1234567 and punctuation...!?", "[CLS] [SEP] [MASK] literal specials",
		strings.Repeat("word ", 40), strings.Repeat("antidisestablishmentarianism ", 30),
		strings.Repeat("the quick brown fox jumps over the lazy dog ", 400),
		strings.Repeat("人人生而自由", 500)}
	for i := range 200 {
		texts = append(texts, fmt.Sprintf("caption %d: %s", i, strings.Repeat("image of a cat ", i%30)))
	}
	return texts
}

// TestCountMatchesEncode: Count and CountBatch give len(Encode) for every bundled
// tokenizer (WordPiece, byte-level BPE), truncation lengths incl. none and one that
// cannot hold BERT's two special tokens, with and without special tokens.
func TestCountMatchesEncode(t *testing.T) {
	texts := countTexts()
	models := []string{"bert-base-uncased.json", "all-minilm-l6-v2.json", "cohere-tokenizer.json", "Meta-Llama-3-8B-Instruct.json"}
	for _, m := range models {
		for _, maxLen := range []int{0, 1, 8, 128} {
			for _, special := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/max=%d/special=%t", m, maxLen, special), func(t *testing.T) {
					cfg := Config{Path: filepath.Join(modelDir(t), m), MaxLength: maxLen, AddSpecialTokens: special, Workers: 2}
					tk, err := Open(cfg)
					if special && maxLen == 1 && m != "Meta-Llama-3-8B-Instruct.json" {
						if !errors.Is(err, ErrBadConfig) {
							t.Fatalf("Open: err %v, want ErrBadConfig (two special tokens in one id)", err)
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					defer tk.Close()
					ids, ierrs, err := tk.EncodeBatch(texts)
					if err != nil {
						t.Fatal(err)
					}
					counts, cerrs, err := tk.CountBatch(texts)
					if err != nil {
						t.Fatal(err)
					}
					for i, s := range texts {
						if (ierrs[i] == nil) != (cerrs[i] == nil) {
							t.Fatalf("text %d %.40q: encode err %v, count err %v", i, s, ierrs[i], cerrs[i])
						}
						if counts[i] != len(ids[i]) {
							t.Fatalf("text %d %.40q: CountBatch %d, want len(ids) %d", i, s, counts[i], len(ids[i]))
						}
						if c, err := tk.Count(s); c != counts[i] || (err == nil) != (cerrs[i] == nil) {
							t.Fatalf("text %d %.40q: Count %d, %v; CountBatch %d, %v", i, s, c, err, counts[i], cerrs[i])
						}
					}
				})
			}
		}
	}
}

// TestCountErrors: a text the model cannot encode is an ErrEncode in its own slot, the
// others are counted; a closed tokenizer gives ErrClosed.
func TestCountErrors(t *testing.T) {
	tk := open(t, "sentence-transformers-labse.json", 32)
	counts, errs, err := tk.CountBatch([]string{"", "hello world", ""})
	if err != nil || errs[0] != nil || !errors.Is(errs[1], ErrEncode) || errs[2] != nil || counts[0] != 2 || counts[2] != 2 {
		t.Errorf("CountBatch = %v, %v, %v; want [2 0 2], [nil ErrEncode nil]", counts, errs, err)
	}
	if _, err := tk.Count("hello world"); !errors.Is(err, ErrEncode) {
		t.Errorf("Count(hello world): err = %v, want ErrEncode", err)
	}
	tk.Close()
	if _, _, err := tk.CountBatch([]string{"x"}); !errors.Is(err, ErrClosed) {
		t.Errorf("CountBatch after Close: err = %v, want ErrClosed", err)
	}
	if _, err := tk.Count("x"); !errors.Is(err, ErrClosed) {
		t.Errorf("Count after Close: err = %v, want ErrClosed", err)
	}
}

// FuzzCount: for any text, Count equals len(Encode) and neither fails (BERT encodes
// everything).
func FuzzCount(f *testing.F) {
	tk := open(f, "bert-base-uncased.json", 32)
	for _, s := range []string{"", "hello hello", "a\xffb", "\x00", "人人生而自由", "x  y\t\nz", strings.Repeat("ab ", 600)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := tk.Encode(s)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tk.Count(s)
		if err != nil || c != len(ids) {
			t.Fatalf("Count(%q) = %d, %v; want %d", s, c, err, len(ids))
		}
	})
}
