package proto

import (
	"errors"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
)

// The tokenizer's vocabulary size and pad id round-trip through the schema
// metadata; malformed or inconsistent values are schema errors.
func TestMetaVocabRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name       string
		vocab, pad int
	}{{"bert", 30522, 0}, {"no pad token", 128256, -1}, {"unknown", 0, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			meta := testMeta(ModalityText, "", nil)
			meta.VocabSize, meta.PadID = tc.vocab, tc.pad
			s, err := Schema(meta)
			if err != nil {
				t.Fatal(err)
			}
			got, err := MetaFromSchema(s)
			if err != nil || got.VocabSize != tc.vocab || got.PadID != tc.pad {
				t.Fatalf("got vocab %d pad %d, %v; want %d %d", got.VocabSize, got.PadID, err, tc.vocab, tc.pad)
			}
		})
	}
	for _, tc := range []struct{ name, vocab, pad string }{
		{"vocab not a number", "lots", "0"},
		{"vocab zero", "0", ""},
		{"pad outside vocab", "100", "100"},
		{"pad negative", "100", "-1"},
		{"pad without vocab", "", "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := Schema(testMeta(ModalityText, "", nil))
			md := s.Metadata()
			keys, vals := append([]string(nil), md.Keys()...), append([]string(nil), md.Values()...)
			if tc.vocab != "" {
				keys, vals = append(keys, MetaVocabSize), append(vals, tc.vocab)
			}
			if tc.pad != "" {
				keys, vals = append(keys, MetaPadID), append(vals, tc.pad)
			}
			bad := arrow.NewMetadata(keys, vals)
			if _, err := MetaFromSchema(arrow.NewSchema(s.Fields(), &bad)); !errors.Is(err, ErrSchema) {
				t.Errorf("got %v, want ErrSchema", err)
			}
		})
	}
	meta := testMeta(ModalityText, "", nil)
	meta.VocabSize, meta.PadID = 10, 10
	if err := meta.Validate(); !errors.Is(err, ErrInvalidMeta) {
		t.Errorf("pad 10 of vocab 10: got %v, want ErrInvalidMeta", err)
	}
}
