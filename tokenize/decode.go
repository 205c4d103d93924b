package tokenize

// Decode returns the text of ids, special tokens skipped (for people: the
// inspect contact sheet shows the caption a rank received). Ids outside the
// vocabulary are dropped. It is safe for concurrent use with Encode.
func (t *Tokenizer) Decode(ids []int32) (string, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed.Load() {
		return "", ErrClosed
	}
	n := uint32(t.tk.VocabSize())
	u := make([]uint32, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && uint32(id) < n {
			u = append(u, uint32(id))
		}
	}
	return t.tk.Decode(u, true), nil
}
