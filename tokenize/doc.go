// Package tokenize turns captions into token ids with a HuggingFace tokenizer.json.
//
// It wraps github.com/daulet/tokenizers, which links the HuggingFace tokenizers Rust
// library (built by `make build` into build/lib; see scripts/build-tokenizers.sh). Any
// model the Rust library supports works: WordPiece, BPE (byte-level or not), Unigram.
//
// Contract:
//   - Open loads a tokenizer.json (Config.Path; empty means the default
//     bert-base-uncased.json found by DefaultTokenizerPath). The file's own padding is
//     switched off (ids are unpadded; batches are padded later, per micro-batch) and its
//     truncation is replaced by Config.MaxLength (right side, special tokens included), so
//     the ids equal those of the Python `tokenizers` package with
//     enable_truncation(MaxLength) and no_padding().
//   - Encode never fails on odd text. Invalid UTF-8 is repaired with U+FFFD; NUL bytes,
//     which the C boundary cannot carry, are dropped (BERT's normalizer drops them too);
//     empty text gives just the special tokens.
//   - Truncation costs time linear in the kept prefix, not in the text: a 10 MB caption
//     is encoded from a growing whitespace-bounded prefix until MaxLength tokens are
//     reached (see encodePrefix), which gives the same ids as encoding the whole text.
//   - A Tokenizer is safe for concurrent use by any number of goroutines (the Rust
//     tokenizer is immutable after loading). Close releases the Rust memory; using a
//     closed Tokenizer returns ErrClosed.
package tokenize
