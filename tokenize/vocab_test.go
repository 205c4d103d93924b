package tokenize

import "testing"

func TestVocabAndPad(t *testing.T) {
	tests := []struct {
		model      string
		wantVocab  int
		wantPad    int
		wantPadSet bool
	}{
		{"bert-base-uncased.json", 30522, 0, true},
		{"all-minilm-l6-v2.json", 30522, 0, true},
		{"Meta-Llama-3-8B-Instruct.json", 128256, -1, false},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			tk := open(t, tt.model, 128)
			if got := tk.VocabSize(); got != tt.wantVocab {
				t.Errorf("VocabSize() = %d, want %d", got, tt.wantVocab)
			}
			if id, ok := tk.PadID(); ok != tt.wantPadSet || ok && id != tt.wantPad {
				t.Errorf("PadID() = %d, %v; want %d, %v", id, ok, tt.wantPad, tt.wantPadSet)
			}
		})
	}
	if got := findPadID([]byte(`{"padding":{"pad_id":3},"model":{"vocab":{"[PAD]":0}}}`)); got != 3 {
		t.Errorf("padding.pad_id: got %d, want 3", got)
	}
	if got := findPadID([]byte(`{"model":{"vocab":[["<pad>",0]]},"added_tokens":[{"id":1,"content":"<pad>"}]}`)); got != 1 {
		t.Errorf("added <pad>: got %d, want 1", got)
	}
}
