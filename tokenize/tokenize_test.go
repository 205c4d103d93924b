package tokenize

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// modelDir is where `make build` puts the tokenizer.json files of the daulet/tokenizers module.
func modelDir(t testing.TB) string {
	t.Helper()
	p, err := DefaultTokenizerPath()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return filepath.Dir(p)
}

func open(t testing.TB, model string, maxLen int) *Tokenizer {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Path = filepath.Join(modelDir(t), model)
	cfg.MaxLength = maxLen
	tk, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open(%s): %v", model, err)
	}
	t.Cleanup(func() { tk.Close() })
	return tk
}

func TestEncodeKnownIDs(t *testing.T) {
	tk := open(t, "bert-base-uncased.json", 128)
	tests := []struct {
		name, text string
		want       []int32
	}{
		{"empty gives specials", "", []int32{101, 102}},
		{"words", "Hello world", []int32{101, 7592, 2088, 102}},
		{"invalid utf8 repaired", "a\xffb", []int32{101, 11113, 102}}, // U+FFFD, which BERT drops: "ab"
		{"nul dropped", "hello\x00world", []int32{101, 7592, 11108, 102}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tk.Encode(tt.text)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
			}
		})
	}
}

func TestTruncation(t *testing.T) {
	for _, maxLen := range []int{8, 128} {
		tk := open(t, "bert-base-uncased.json", maxLen)
		huge := strings.Repeat("the quick brown fox jumps over the lazy dog ", 250_000) // ~11 MB
		got, err := tk.Encode(huge)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != maxLen || got[0] != 101 || got[len(got)-1] != 102 {
			t.Errorf("max_length %d: got %d ids (first %d, last %d), want %d framed by [CLS]/[SEP]",
				maxLen, len(got), got[0], got[len(got)-1], maxLen)
		}
	}
}

// TestPrefixMatchesWhole checks the claim of prefix.go on every bundled tokenizer: encoding a
// growing prefix gives exactly the ids of encoding the whole text.
func TestPrefixMatchesWhole(t *testing.T) {
	texts := []string{
		strings.Repeat("Punctuation... then\n\nnewlines, digits 1234567 and CamelCase words. ", 400),
		strings.Repeat("Tous les êtres humains naissent libres — 人人生而自由 🙂 ", 600),
		strings.Repeat("x", 5000) + " " + strings.Repeat("word ", 3000),
		strings.Repeat("a1 ", 2000) + strings.Repeat("\t", 10) + strings.Repeat("b2 ", 2000),
	}
	models := []string{"bert-base-uncased.json", "cohere-tokenizer.json", "Meta-Llama-3-8B-Instruct.json", "all-minilm-l6-v2.json"}
	for _, m := range models {
		for _, maxLen := range []int{16, 128} {
			tk := open(t, m, maxLen)
			for i, text := range texts {
				got, _ := tk.encodePrefix(text)
				want, _ := tk.encode(text)
				if !slices.Equal(got, want) {
					t.Errorf("%s max %d text %d: prefix ids differ from whole-text ids\n got %v\nwant %v", m, maxLen, i, got, want)
				}
				if c, _ := tk.countPrefix(text); c != len(want) {
					t.Errorf("%s max %d text %d: prefix count %d, want %d", m, maxLen, i, c, len(want))
				}
			}
		}
	}
}

func TestEncodeBatchMatchesEncode(t *testing.T) {
	tk := open(t, "bert-base-uncased.json", 64)
	var texts []string
	for i := range 500 {
		texts = append(texts, strings.Repeat("caption number ", i%40)+string(rune('a'+i%26)))
	}
	got, errs, err := tk.EncodeBatch(texts)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range texts {
		if errs[i] != nil {
			t.Fatalf("EncodeBatch[%d]: %v", i, errs[i])
		}
		want, _ := tk.Encode(s)
		if !slices.Equal(got[i], want) {
			t.Fatalf("EncodeBatch[%d] = %v, want %v", i, got[i], want)
		}
	}
}

func TestConcurrentUseAndClose(t *testing.T) {
	tk := open(t, "bert-base-uncased.json", 128)
	want, _ := tk.Encode("concurrent captions are fine")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				got, err := tk.Encode("concurrent captions are fine")
				if err != nil || !slices.Equal(got, want) {
					t.Errorf("concurrent Encode = %v, %v; want %v", got, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := tk.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := tk.Encode("x"); !errors.Is(err, ErrClosed) {
		t.Errorf("Encode after Close: err = %v, want ErrClosed", err)
	}
	if err := tk.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"version": "1.0"}`), 0o644)
	garbage := filepath.Join(dir, "garbage.json")
	os.WriteFile(garbage, []byte("\x00\x01not json"), 0o644)
	tests := []struct {
		name string
		cfg  Config
	}{
		{"missing file", Config{Path: filepath.Join(dir, "nope.json"), MaxLength: 8}},
		{"no model", Config{Path: bad, MaxLength: 8}},
		{"garbage", Config{Path: garbage, MaxLength: 8}},
		{"negative max length", Config{Path: bad, MaxLength: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tk, err := Open(tt.cfg); err == nil {
				tk.Close()
				t.Errorf("Open(%+v) succeeded, want error", tt.cfg)
			}
		})
	}
}

// TestEncodeErrorReported uses the LaBSE file of the daulet/tokenizers test data, whose
// vocabulary lacks its own [UNK] token: the Rust library fails on every word (Python's
// tokenizers raises "Missing [UNK] token"), and that must surface as ErrEncode, not as an
// empty id list that would slip into a batch.
func TestEncodeErrorReported(t *testing.T) {
	tk := open(t, "sentence-transformers-labse.json", 32)
	if got, err := tk.Encode(""); err != nil || len(got) != 2 {
		t.Errorf("Encode(\"\") = %v, %v; want the two special tokens", got, err)
	}
	if _, err := tk.Encode("hello world"); !errors.Is(err, ErrEncode) {
		t.Errorf("Encode(hello world): err = %v, want ErrEncode", err)
	}
	_, errs, err := tk.EncodeBatch([]string{"", "a", ""})
	if err != nil || errs[0] != nil || !errors.Is(errs[1], ErrEncode) || errs[2] != nil {
		t.Errorf("EncodeBatch errs = %v, %v; want [nil ErrEncode nil]", errs, err)
	}
}

func FuzzEncode(f *testing.F) {
	tk := open(f, "bert-base-uncased.json", 32)
	for _, s := range []string{"", "hello", "a\xffb", "\x00", "人人生而自由", strings.Repeat("ab ", 600)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := tk.Encode(s)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) < 2 || len(ids) > 32 || ids[0] != 101 || ids[len(ids)-1] != 102 {
			t.Fatalf("Encode(%q) = %v: want 2..32 ids framed by [CLS]/[SEP]", s, ids)
		}
	})
}
