// Package synth writes synthetic image–caption corpora for tests, demos and
// benchmarks.
//
// Generate(ctx, cfg) writes cfg.Samples samples under cfg.Out, either as a
// JSONL manifest with an images/ folder (Format "jsonl") or as WebDataset
// .tar shards (Format "wds"). The output is a pure function of the Config
// (same seed → byte-identical files), whatever the number of workers:
// sample i is generated from its own random stream derived from (Seed, i).
//
// With Skew "strong" (the default) images vary in size (sides 32..1024 px,
// long side log-normal around 256 px; PNGs at most 512 px), aspect ratio (1:4..4:1) and content
// complexity (flat colour, gradients, shapes, noise), mixing JPEG and PNG,
// and captions have a long-tailed word count (log-normal, median ~9 words,
// a few paragraphs of hundreds of words) drawn Zipf-like from a built-in
// list that includes multi-script words. With Skew "none" every image is
// FixedSide×FixedSide JPEG of the same content kind and every caption has
// FixedWords words.
//
// BadFraction injects bad samples (see the Bad* kinds) and Summary.Bad lists
// them with the loader reject reason each should produce, so tests can check
// the quarantine.
//
// Generate writes files only under cfg.Out (created if needed) and uses up
// to cfg.Workers goroutines; it is safe to call concurrently with different
// Out folders.
package synth
