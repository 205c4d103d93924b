package tokenize

// Long captions are not encoded whole. With truncation at MaxLength, only the ids of a
// prefix matter, so encodePrefix encodes text[:cut] for cuts that grow geometrically
// (16·MaxLength bytes, then ×2) and stops at the first prefix that already fills
// MaxLength ids. The total work is linear in the kept prefix, not in the text. Counting
// (countPrefix) does the same with counts.
//
// Why the ids are the same as for the whole text: cut is always placed on an ASCII space
// or tab that follows an ASCII letter or digit. Every pre-tokenizer the Rust library has
// (BERT whitespace/punctuation split, byte-level regexes of GPT-2 and Llama 3, Metaspace)
// ends a pre-token there and starts the next one at the space, normalizers act per
// character, and models (WordPiece, BPE, Unigram) work within one pre-token. So the
// prefix's tokens are a prefix of the text's tokens; when the prefix fills MaxLength
// after truncation, so does the text, with the same ids. A text with no such cut point
// (CJK without spaces, one giant word) is encoded whole. TestPrefixMatchesWhole checks it
// on every bundled tokenizer.

const prefixBytesPerToken = 16

// long reports whether text is long enough for the prefix path.
func (t *Tokenizer) long(text string) bool {
	return t.cfg.MaxLength > 0 && len(text) > prefixBytesPerToken*t.cfg.MaxLength
}

// encodePrefix returns the ids of text; ok is false when the model cannot encode it.
func (t *Tokenizer) encodePrefix(text string) (ids []uint32, ok bool) {
	maxLen := t.cfg.MaxLength
	if t.long(text) {
		for n := prefixBytesPerToken * maxLen; n < len(text); n *= 2 {
			cut := cutPoint(text, n)
			if cut <= 0 {
				continue
			}
			if ids, ok := t.encode(text[:cut]); ok && len(ids) >= maxLen {
				return ids, true
			}
		}
	}
	return t.encode(text)
}

// countPrefix is encodePrefix for the id count; ok is false when the model cannot encode it.
func (t *Tokenizer) countPrefix(text string) (int, bool) {
	maxLen := t.cfg.MaxLength
	if t.long(text) {
		for n := prefixBytesPerToken * maxLen; n < len(text); n *= 2 {
			cut := cutPoint(text, n)
			if cut <= 0 {
				continue
			}
			if c, ok := t.count(text[:cut]); ok && c >= maxLen {
				return c, true
			}
		}
	}
	return t.count(text)
}

// cutPoint returns the largest i in [n/2, n] with text[i] a space or tab and text[i-1] an
// ASCII letter or digit, or -1.
func cutPoint(text string, n int) int {
	for i := n; i > n/2 && i > 0; i-- {
		if (text[i] == ' ' || text[i] == '\t') && isASCIIAlnum(text[i-1]) {
			return i
		}
	}
	return -1
}

func isASCIIAlnum(b byte) bool {
	return b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}
