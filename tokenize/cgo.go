package tokenize

// The static library built by `make build` (scripts/build-tokenizers.sh) lives in
// build/lib at the repository root. Naming it here lets plain `go build` and `go test`
// link without extra environment once the library is built.
//
// This package calls the library's C API directly: the daulet/tokenizers loader and
// free functions, and mmfeed's batch entry points (scripts/tokenizers/mmfeed_batch.rs).
// The Go module github.com/daulet/tokenizers is the source the library is built from;
// its blank import keeps it in go.mod and adds its link-time version check.

/*
#cgo LDFLAGS: -L${SRCDIR}/../build/lib -ltokenizers -ldl -lm -lstdc++
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct mmfeed_tokenizers_options { bool encode_special_tokens; };

void *tokenizers_from_bytes(const uint8_t *config, uint32_t len, const struct mmfeed_tokenizers_options *options, char **error);
void tokenizers_free_tokenizer(void *ptr);
void tokenizers_free_string(char *s);
char *tokenizers_decode(void *ptr, const uint32_t *ids, uint32_t len, bool skip_special_tokens);
uint32_t tokenizers_vocab_size(void *ptr);

int64_t mmfeed_encode_batch(void *ptr, void *cache, const uint8_t *buf, const uint32_t *offsets, uint32_t n, uint32_t start,
	bool add_special_tokens, uint32_t *out_ids, size_t cap, uint32_t *out_lens);
void *mmfeed_count_cache_new(void *ptr);
void mmfeed_count_cache_free(void *cache);
int32_t mmfeed_count_batch(void *ptr, void *cache, const uint8_t *buf, const uint32_t *offsets, uint32_t n,
	bool add_special_tokens, uint32_t *out_counts);
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	_ "github.com/daulet/tokenizers"
)

// handle is a loaded Rust tokenizer. Its methods are safe for concurrent use.
type handle struct{ p unsafe.Pointer }

func loadHandle(config []byte) (handle, error) {
	if len(config) == 0 {
		return handle{}, errors.New("empty tokenizer.json")
	}
	var cerr *C.char
	opts := C.struct_mmfeed_tokenizers_options{encode_special_tokens: false}
	p := C.tokenizers_from_bytes((*C.uint8_t)(unsafe.Pointer(&config[0])), C.uint32_t(len(config)), &opts, &cerr)
	if p == nil {
		if cerr != nil {
			msg := C.GoString(cerr)
			C.tokenizers_free_string(cerr)
			return handle{}, errors.New(msg)
		}
		return handle{}, errors.New("tokenizer did not load")
	}
	return handle{p}, nil
}

func (h handle) free() { C.tokenizers_free_tokenizer(h.p) }

// VocabSize is the tokenizer's vocabulary size.
func (h handle) VocabSize() int { return int(C.tokenizers_vocab_size(h.p)) }

// Decode returns the text of ids (which must be in the vocabulary).
func (h handle) Decode(ids []uint32, skipSpecial bool) string {
	if len(ids) == 0 {
		return ""
	}
	res := C.tokenizers_decode(h.p, (*C.uint32_t)(unsafe.Pointer(&ids[0])), C.uint32_t(len(ids)), C.bool(skipSpecial))
	if res == nil {
		return ""
	}
	defer C.tokenizers_free_string(res)
	return C.GoString(res)
}

// failed marks a text whose encode failed, in lengths and counts.
const failed = ^uint32(0)

// packed is a batch of texts as one buffer and n+1 offsets, the form the C side reads.
type packed struct {
	buf  []byte
	offs []uint32
}

func pack(texts []string) (packed, error) {
	total := 0
	for _, s := range texts {
		total += len(s)
	}
	if total >= 1<<32 {
		return packed{}, fmt.Errorf("%w: batch of %d bytes", ErrEncode, total)
	}
	p := packed{buf: make([]byte, 0, max(total, 1)), offs: make([]uint32, 1, len(texts)+1)}
	for _, s := range texts {
		p.buf = append(p.buf, s...)
		p.offs = append(p.offs, uint32(len(p.buf)))
	}
	return p, nil
}

func (p *packed) n() int { return len(p.offs) - 1 }

// encodeBatch returns the ids of each text (nil for a failed one) and whether it failed,
// in one cgo call when the ids fit capHint, more when they do not.
func (h handle) encodeBatch(texts []string, addSpecial bool, capHint int, caches *countCaches) ([][]uint32, []bool, error) {
	p, err := pack(texts)
	if err != nil {
		return nil, nil, err
	}
	n := p.n()
	if n == 0 {
		return nil, nil, nil
	}
	cache := caches.get(h)
	if cache == nil {
		return nil, nil, fmt.Errorf("%w: no cache", ErrEncode)
	}
	defer caches.put(cache)
	ids := make([][]uint32, n)
	bad := make([]bool, n)
	lens := make([]uint32, n)
	for start := 0; start < n; {
		buf := make([]uint32, max(capHint, 1))
		done := int(C.mmfeed_encode_batch(h.p, cache, (*C.uint8_t)(unsafe.SliceData(p.buf)), (*C.uint32_t)(unsafe.SliceData(p.offs)),
			C.uint32_t(n), C.uint32_t(start), C.bool(addSpecial), (*C.uint32_t)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)),
			(*C.uint32_t)(unsafe.Pointer(&lens[0]))))
		if done < start {
			return nil, nil, fmt.Errorf("%w: bad batch call", ErrEncode)
		}
		used := 0
		for i := start; i < done; i++ {
			if lens[i] == failed {
				bad[i] = true
				continue
			}
			ids[i] = buf[used : used+int(lens[i]) : used+int(lens[i])]
			used += int(lens[i])
		}
		if done < n && lens[done] != failed && int(lens[done]) > capHint {
			capHint = int(lens[done]) // one text needs more than a whole buffer
		}
		start = done
	}
	return ids, bad, nil
}

// countCaches hands out the Rust side's caches (token counts of words and chunks, and ids
// of chunks, already seen), one per concurrent caller; they live until free.
type countCaches struct {
	mu   sync.Mutex
	idle []unsafe.Pointer
}

func (c *countCaches) get(h handle) unsafe.Pointer {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.idle); n > 0 {
		p := c.idle[n-1]
		c.idle = c.idle[:n-1]
		return p
	}
	return C.mmfeed_count_cache_new(h.p)
}

func (c *countCaches) put(p unsafe.Pointer) {
	c.mu.Lock()
	c.idle = append(c.idle, p)
	c.mu.Unlock()
}

// free releases the idle caches; the caller makes sure none is in use.
func (c *countCaches) free() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.idle {
		C.mmfeed_count_cache_free(p)
	}
	c.idle = nil
}

// countBatch returns each text's id count, failed for a text that cannot be encoded.
func (h handle) countBatch(texts []string, addSpecial bool, caches *countCaches) ([]uint32, error) {
	p, err := pack(texts)
	if err != nil {
		return nil, err
	}
	counts := make([]uint32, p.n())
	if p.n() == 0 {
		return counts, nil
	}
	cache := caches.get(h)
	if cache == nil {
		return nil, fmt.Errorf("%w: no count cache", ErrEncode)
	}
	defer caches.put(cache)
	if C.mmfeed_count_batch(h.p, cache, (*C.uint8_t)(unsafe.SliceData(p.buf)), (*C.uint32_t)(unsafe.SliceData(p.offs)),
		C.uint32_t(p.n()), C.bool(addSpecial), (*C.uint32_t)(unsafe.Pointer(&counts[0]))) != 0 {
		return nil, fmt.Errorf("%w: bad batch call", ErrEncode)
	}
	return counts, nil
}
