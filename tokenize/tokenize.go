package tokenize

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// DefaultModel is the tokenizer used when Config.Path is empty.
const DefaultModel = "bert-base-uncased.json"

// Config selects the tokenizer and how text is encoded.
type Config struct {
	// Path of a HuggingFace tokenizer.json. Empty: DefaultTokenizerPath().
	Path string
	// MaxLength is the most ids per text, special tokens included (right truncation).
	// 0 disables truncation. Default 128.
	MaxLength int
	// AddSpecialTokens adds the model's special tokens ([CLS] … [SEP] for BERT). Default true.
	AddSpecialTokens bool
	// Workers bounds the goroutines EncodeBatch uses. 0 means GOMAXPROCS.
	Workers int
}

// DefaultConfig returns bert-base-uncased, 128 ids, special tokens on.
func DefaultConfig() Config {
	return Config{MaxLength: 128, AddSpecialTokens: true}
}

// Validate reports a field out of range.
func (c Config) Validate() error {
	if c.MaxLength < 0 || c.MaxLength > 1<<20 {
		return fmt.Errorf("%w: max_length %d out of range [0, 1048576]", ErrBadConfig, c.MaxLength)
	}
	if c.Workers < 0 {
		return fmt.Errorf("%w: workers %d < 0", ErrBadConfig, c.Workers)
	}
	return nil
}

// Tokenizer encodes text to ids. Safe for concurrent use.
type Tokenizer struct {
	cfg    Config
	path   string
	mu     sync.RWMutex // guards tk against Close while encodes run
	tk     handle
	caches countCaches // count caches, freed by Close
	closed atomic.Bool
	vocab  int // VocabSize
	pad    int // PadID, -1 when none
}

// Open loads the tokenizer named by cfg.
func Open(cfg Config) (*Tokenizer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	path := cfg.Path
	if path == "" {
		p, err := DefaultTokenizerPath()
		if err != nil {
			return nil, err
		}
		path = p
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenize: read %s: %w", path, err)
	}
	data, err := withTruncation(raw, cfg.MaxLength)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %s: %w", path, err)
	}
	tk, err := loadHandle(data)
	if err != nil {
		return nil, fmt.Errorf("tokenize: load %s: %w", path, err)
	}
	t := &Tokenizer{cfg: cfg, path: path, tk: tk, vocab: tk.VocabSize(), pad: findPadID(raw)}
	// The empty text's ids are the special tokens. A max_length that cannot hold them
	// makes the Rust library skip truncation altogether; refuse it.
	if specials, ok := t.count(""); !ok || cfg.MaxLength > 0 && specials > cfg.MaxLength {
		t.caches.free()
		tk.free()
		return nil, fmt.Errorf("%w: max_length %d cannot hold the %d special tokens of %s", ErrBadConfig, cfg.MaxLength, specials, path)
	}
	return t, nil
}

// withTruncation rewrites a tokenizer.json so that padding is off and truncation is
// exactly maxLen (right side), whatever the file said.
func withTruncation(raw []byte, maxLen int) ([]byte, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %w", err)
	}
	if _, ok := doc["model"]; !ok {
		return nil, fmt.Errorf("not a tokenizer.json: no \"model\"")
	}
	doc["padding"] = json.RawMessage("null")
	doc["truncation"] = json.RawMessage("null")
	if maxLen > 0 {
		doc["truncation"] = json.RawMessage(fmt.Sprintf(
			`{"direction":"Right","max_length":%d,"strategy":"LongestFirst","stride":0}`, maxLen))
	}
	return json.Marshal(doc)
}

// Path is the tokenizer.json this Tokenizer was loaded from.
func (t *Tokenizer) Path() string { return t.path }

// MaxLength is the truncation length (0: none).
func (t *Tokenizer) MaxLength() int { return t.cfg.MaxLength }

// Encode returns the ids of one text.
func (t *Tokenizer) Encode(text string) ([]int32, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed.Load() {
		return nil, ErrClosed
	}
	return t.encodeChecked(text)
}

func (t *Tokenizer) encodeChecked(text string) ([]int32, error) {
	ids, ok := t.encodePrefix(clean(text))
	if !ok {
		return nil, fmt.Errorf("%w: %.40q", ErrEncode, text)
	}
	return asInt32(ids), nil
}

// EncodeBatch encodes texts in parallel (Config.Workers goroutines); out[i] belongs to texts[i].
// A text the model cannot encode gets nil ids and its error in errs[i]; err is ErrClosed or nil.
// Texts go to the Rust library batchSize at a time, one cgo call per batch.
func (t *Tokenizer) EncodeBatch(texts []string) (out [][]int32, errs []error, err error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed.Load() {
		return nil, nil, ErrClosed
	}
	out = make([][]int32, len(texts))
	errs = make([]error, len(texts))
	err = t.forChunks(len(texts), func(lo, hi int) error {
		return t.encodeChunk(texts[lo:hi], out[lo:hi], errs[lo:hi])
	})
	return out, errs, err
}

// Close releases the Rust tokenizer. It waits for running encodes; later calls fail with ErrClosed.
func (t *Tokenizer) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed.Swap(true) {
		return nil
	}
	t.caches.free()
	t.tk.free()
	return nil
}

// clean repairs what the C boundary cannot carry: invalid UTF-8 becomes U+FFFD
// (as Python's errors="replace" does), NUL bytes are dropped.
func clean(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "")
	}
	return s
}

// DefaultTokenizerPath finds DefaultModel: $MMFEED_TOKENIZER (a file), else
// $MMFEED_TOKENIZER_DIR/DefaultModel, else build/tokenizers/DefaultModel next to the
// executable's parent (bin/../build) or in the working directory or any parent of it.
func DefaultTokenizerPath() (string, error) {
	if p := os.Getenv("MMFEED_TOKENIZER"); p != "" {
		return p, nil
	}
	var dirs []string
	if d := os.Getenv("MMFEED_TOKENIZER_DIR"); d != "" {
		dirs = append(dirs, d)
	}
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Join(filepath.Dir(exe), "..", "build", "tokenizers"))
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			dirs = append(dirs, filepath.Join(d, "build", "tokenizers"))
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	for _, d := range dirs {
		p := filepath.Join(d, DefaultModel)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", ErrNoTokenizer
}
