// Package tokenize turns captions into token ids with a HuggingFace tokenizer.json.
//
// It calls the HuggingFace tokenizers Rust library that github.com/daulet/tokenizers
// wraps (built by `make build` into build/lib from that module's sources plus mmfeed's
// batch entry points; see scripts/build-tokenizers.sh) through its C API. Any
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
//   - Count and CountBatch return exactly len(Encode(text)) without building ids,
//     offsets, masks or token strings (the feature pass needs only counts). Counts of
//     words, and for BERT-style pipelines of space-separated chunks, are cached per
//     Tokenizer (bounded), so a repeated word costs a hash lookup.
//   - EncodeBatch and CountBatch cross the cgo boundary once per batchSize texts, into
//     mmfeed's entry points of the Rust library (scripts/tokenizers/mmfeed_batch.rs).
//   - A Tokenizer is safe for concurrent use by any number of goroutines (the Rust
//     tokenizer is immutable after loading). Close releases the Rust memory; using a
//     closed Tokenizer returns ErrClosed.
package tokenize
