package proto

import (
	"encoding/json"
	"os"
	"testing"
)

// TestMetaKeysMatchTrainer fails when the schema metadata keys here drift
// from trainer/mmfeed_trainer/schema_keys.json, the one definition that the
// Python trainer reads (mmfeed_trainer/keys.py).
func TestMetaKeysMatchTrainer(t *testing.T) {
	raw, err := os.ReadFile("../trainer/mmfeed_trainer/schema_keys.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		SchemaVersion string            `json:"schema_version"`
		Meta          map[string]string `json:"schema_metadata"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.SchemaVersion != SchemaVersion {
		t.Errorf("schema_keys.json schema_version %q, Go SchemaVersion %q", doc.SchemaVersion, SchemaVersion)
	}
	ours := map[string]string{
		"schema_version": MetaSchemaVersion, "job": MetaJob, "epoch": MetaEpoch, "dp_rank": MetaDPRank,
		"mp_rank": MetaMPRank, "modality": MetaModality, "pack": MetaPack, "vocab_size": MetaVocabSize, "pad_id": MetaPadID,
	}
	for name, key := range ours {
		if doc.Meta[name] != key {
			t.Errorf("key %s: schema_keys.json says %q, proto says %q", name, doc.Meta[name], key)
		}
	}
	for name := range doc.Meta {
		if _, ok := ours[name]; !ok {
			t.Errorf("schema_keys.json defines %s, which proto does not", name)
		}
	}
	// Every key Schema writes is one of them.
	meta := testMeta(ModalityAll, DTypeUint8, nil)
	meta.Pack, meta.VocabSize, meta.PadID = true, 30522, 0
	s, err := Schema(meta)
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, key := range doc.Meta {
		defined[key] = true
	}
	for _, k := range s.Metadata().Keys() {
		if !defined[k] {
			t.Errorf("Schema writes %s, which schema_keys.json does not define", k)
		}
	}
}
