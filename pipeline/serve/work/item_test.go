package work

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/mmfeed/mmfeed/proto"
)

func validItem() BatchItem {
	it := BatchItem{Kind: "batch", Config: "c0ffee", Job: "job-1", Epoch: 1, Step: 2, DP: 1, MicroBatch: 0,
		Metas:   []proto.BatchMeta{{Job: "job-1", Epoch: 1, Step: 2, DPRank: 1, MPRank: 0, Modality: proto.ModalityAll}},
		Samples: []Sample{{ID: "a", TextTokens: 3, ImageTokens: 4, Cost: 1.5, Weight: 1}}, DeadlineMS: 2000}
	if err := it.Seal(); err != nil {
		panic(err)
	}
	return it
}

func TestBatchItemValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*BatchItem)
		ok   bool
	}{
		{"valid", func(*BatchItem) {}, true},
		{"bad job", func(it *BatchItem) { it.Job = "a b" }, false},
		{"no id", func(it *BatchItem) { it.ID = "" }, false},
		{"no config", func(it *BatchItem) { it.Config = "" }, false},
		{"no samples", func(it *BatchItem) { it.Samples = nil }, false},
		{"no metas", func(it *BatchItem) { it.Metas = nil }, false},
		{"negative step", func(it *BatchItem) { it.Step = -1 }, false},
		{"negative deadline", func(it *BatchItem) { it.DeadlineMS = -1 }, false},
		{"meta for another step", func(it *BatchItem) { it.Metas[0].Step = 3 }, false},
		{"meta for another job", func(it *BatchItem) { it.Metas[0].Job = "job-2" }, false},
		{"meta mp out of order", func(it *BatchItem) { it.Metas[0].MPRank = 1 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			it := validItem()
			tc.edit(&it)
			err := it.validate()
			if got := err == nil; got != tc.ok {
				t.Fatalf("validate: %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, proto.ErrControl) && !errors.Is(err, proto.ErrInvalidName) {
				t.Errorf("error %v is neither ErrControl nor ErrInvalidName", err)
			}
		})
	}
}

// The item id names the content: equal items have equal ids, any change
// changes it.
func TestBatchItemIDNamesTheContent(t *testing.T) {
	a, b := validItem(), validItem()
	if a.ID != b.ID || a.ID == "" {
		t.Fatalf("ids %q, %q", a.ID, b.ID)
	}
	b.Samples[0].Weight = 0
	if err := b.Seal(); err != nil {
		t.Fatal(err)
	}
	if a.ID == b.ID {
		t.Error("a changed sample weight kept the id")
	}
}

// A worker parses whatever the queue holds: no input panics, and what it
// accepts is valid.
func FuzzBatchItem(f *testing.F) {
	it := validItem()
	b, _ := json.Marshal(it)
	f.Add(b)
	f.Add([]byte(`{"kind":"batch","metas":[{}],"samples":[{}]}`))
	f.Add([]byte(`{"kind":"features","lo":-1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var it BatchItem
		if json.Unmarshal(data, &it) != nil {
			return
		}
		if it.validate() == nil && (it.ID == "" || len(it.Metas) == 0 || len(it.Samples) == 0) {
			t.Fatalf("accepted %s", data)
		}
		var fi FeatureItem
		_ = json.Unmarshal(data, &fi)
	})
}
