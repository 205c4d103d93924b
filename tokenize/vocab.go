package tokenize

import "encoding/json"

// padNames are the pad token spellings looked up when a tokenizer.json
// configures no padding (BERT, T5/SentencePiece, GPT-style).
var padNames = []string{"[PAD]", "<pad>", "<|pad|>", "<|endoftext|>"}

// VocabSize is the number of ids the tokenizer can emit, added tokens included.
func (t *Tokenizer) VocabSize() int { return t.vocab }

// PadID is the tokenizer's pad token id: the padding.pad_id of its
// tokenizer.json, else the id of a token named [PAD], <pad>, <|pad|> or
// <|endoftext|>. ok is false when the tokenizer has none.
func (t *Tokenizer) PadID() (id int, ok bool) { return t.pad, t.pad >= 0 }

// findPadID reads the pad id out of a raw tokenizer.json; -1 when none.
func findPadID(raw []byte) int {
	var doc struct {
		Padding *struct {
			PadID *int `json:"pad_id"`
		} `json:"padding"`
		AddedTokens []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
		Model struct {
			Vocab json.RawMessage `json:"vocab"`
		} `json:"model"`
	}
	if json.Unmarshal(raw, &doc) != nil {
		return -1
	}
	if doc.Padding != nil && doc.Padding.PadID != nil {
		return *doc.Padding.PadID
	}
	var vocab map[string]int // WordPiece/BPE/WordLevel; Unigram's list does not parse and is skipped
	_ = json.Unmarshal(doc.Model.Vocab, &vocab)
	for _, name := range padNames {
		for _, tok := range doc.AddedTokens {
			if tok.Content == name {
				return tok.ID
			}
		}
		if id, ok := vocab[name]; ok {
			return id
		}
	}
	return -1
}
