package tokenize

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// batchSize is how many texts go to the Rust library in one cgo call.
const batchSize = 256

// Count returns the number of ids Encode would return for text, without building them.
func (t *Tokenizer) Count(text string) (int, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed.Load() {
		return 0, ErrClosed
	}
	c, ok := t.countPrefix(clean(text))
	if !ok {
		return 0, fmt.Errorf("%w: %.40q", ErrEncode, text)
	}
	return c, nil
}

// CountBatch is EncodeBatch for the id counts only: counts[i] == len(ids of texts[i]). It
// builds no ids, offsets, masks or token strings, and makes one cgo call per batchSize
// texts. A text the model cannot encode gets count 0 and its error in errs[i]; err is
// ErrClosed or nil.
func (t *Tokenizer) CountBatch(texts []string) (counts []int, errs []error, err error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed.Load() {
		return nil, nil, ErrClosed
	}
	counts = make([]int, len(texts))
	errs = make([]error, len(texts))
	err = t.forChunks(len(texts), func(lo, hi int) error {
		return t.countChunk(texts[lo:hi], counts[lo:hi], errs[lo:hi])
	})
	return counts, errs, err
}

// forChunks runs fn over [0, n) in chunks of batchSize on Config.Workers goroutines and
// returns the first error.
func (t *Tokenizer) forChunks(n int, fn func(lo, hi int) error) error {
	workers := t.cfg.Workers
	if workers == 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	chunks := (n + batchSize - 1) / batchSize
	workers = max(1, min(workers, chunks))
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				c := int(next.Add(1) - 1)
				if c >= chunks {
					return
				}
				if err := fn(c*batchSize, min(n, (c+1)*batchSize)); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	wg.Wait()
	return first
}

// encodeChunk encodes one chunk: short texts in one batch call, long ones by prefix.
func (t *Tokenizer) encodeChunk(texts []string, out [][]int32, errs []error) error {
	short, idx := t.splitShort(texts)
	capHint := len(short) * t.cfg.MaxLength
	if t.cfg.MaxLength == 0 {
		for _, s := range short {
			capHint += len(s) + 8
		}
	}
	ids, bad, err := t.tk.encodeBatch(short, t.cfg.AddSpecialTokens, capHint, &t.caches)
	if err != nil {
		return err
	}
	for j, i := range idx {
		if bad[j] {
			errs[i] = fmt.Errorf("%w: %.40q", ErrEncode, texts[i])
			continue
		}
		out[i] = asInt32(ids[j])
	}
	for i, s := range texts {
		if !t.long(s) {
			continue
		}
		out[i], errs[i] = t.encodeChecked(s)
	}
	return nil
}

// countChunk counts one chunk: short texts in one batch call, long ones by prefix.
func (t *Tokenizer) countChunk(texts []string, counts []int, errs []error) error {
	short, idx := t.splitShort(texts)
	cs, err := t.tk.countBatch(short, t.cfg.AddSpecialTokens, &t.caches)
	if err != nil {
		return err
	}
	for j, i := range idx {
		if cs[j] == failed {
			errs[i] = fmt.Errorf("%w: %.40q", ErrEncode, texts[i])
			continue
		}
		counts[i] = int(cs[j])
	}
	for i, s := range texts {
		if !t.long(s) {
			continue
		}
		c, ok := t.countPrefix(clean(s))
		if !ok {
			errs[i] = fmt.Errorf("%w: %.40q", ErrEncode, s)
			continue
		}
		counts[i] = c
	}
	return nil
}

// splitShort returns the cleaned texts that are not long, with their indexes in texts.
func (t *Tokenizer) splitShort(texts []string) ([]string, []int) {
	short := make([]string, 0, len(texts))
	idx := make([]int, 0, len(texts))
	for i, s := range texts {
		if !t.long(s) {
			short = append(short, clean(s))
			idx = append(idx, i)
		}
	}
	return short, idx
}

// encode returns the ids of one (clean) text; ok is false when the model fails.
func (t *Tokenizer) encode(text string) ([]uint32, bool) {
	capHint := t.cfg.MaxLength
	if capHint == 0 {
		capHint = len(text) + 8
	}
	ids, bad, err := t.tk.encodeBatch([]string{text}, t.cfg.AddSpecialTokens, capHint, &t.caches)
	if err != nil || bad[0] {
		return nil, false
	}
	return ids[0], true
}

// count returns the id count of one (clean) text; ok is false when the model fails.
func (t *Tokenizer) count(text string) (int, bool) {
	cs, err := t.tk.countBatch([]string{text}, t.cfg.AddSpecialTokens, &t.caches)
	if err != nil || cs[0] == failed {
		return 0, false
	}
	return int(cs[0]), true
}

// asInt32 views ids as int32 without copying (ids are < 2^31 in every vocabulary).
func asInt32(ids []uint32) []int32 {
	if ids == nil {
		return []int32{}
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(ids))), len(ids))
}
