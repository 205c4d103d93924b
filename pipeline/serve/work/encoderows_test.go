package work

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/mmfeed/mmfeed/proto"
)

// TestEncodeRows: the one builder and encoder of served batches and work
// results gives a payload that decodes to its rows, releases what it
// allocates, and names the batch of a row it refuses.
func TestEncodeRows(t *testing.T) {
	text := proto.BatchMeta{Job: "j", Epoch: 1, Step: 2, DPRank: 1, MPRank: 1, Modality: proto.ModalityText, VocabSize: 1000, PadID: 0}
	vision := proto.BatchMeta{Job: "j", Epoch: 1, Step: 2, Modality: proto.ModalityAll, DType: proto.DTypeUint8,
		Shape: []int{3, 2, 2}, Mean: [3]float32{0.5, 0.5, 0.5}, Std: [3]float32{0.25, 0.25, 0.25}, VocabSize: 1000, PadID: 0}
	row := func(id string, w float32) proto.Row {
		return proto.Row{ID: id, InputIDs: []int32{101, 7, 102}, TextTokens: 3, ImageTokens: 1, Cost: 2, Weight: w,
			PixelShape: [3]int32{3, 2, 2}, Pixels: make([]byte, 12)}
	}
	tests := []struct {
		name    string
		meta    proto.BatchMeta
		rows    []proto.Row
		wantErr string
	}{
		{"text", text, []proto.Row{row("a", 1), row("b", 0)}, ""},
		{"image and text", vision, []proto.Row{row("a", 1), row("b", 1)}, ""},
		{"a bad row names the batch", vision, []proto.Row{row("a", 1), {ID: "b", Weight: 1, Cost: -1}}, "serve: build"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
			defer mem.AssertSize(t, 0)
			payload, _, _, err := EncodeRows(mem, tc.meta, tc.rows)
			if tc.wantErr != "" {
				if !errors.Is(err, proto.ErrInvalidRow) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an ErrInvalidRow naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			rec, err := proto.DecodeIPC(mem, payload)
			if err != nil {
				t.Fatal(err)
			}
			_, got, err := proto.ReadRows(rec)
			rec.Release()
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.rows) {
				t.Fatalf("got %d rows, want %d", len(got), len(tc.rows))
			}
			for i := range got {
				if got[i].ID != tc.rows[i].ID || got[i].Weight != tc.rows[i].Weight || !reflect.DeepEqual(got[i].InputIDs, tc.rows[i].InputIDs) {
					t.Errorf("row %d: got %+v, want %+v", i, got[i], tc.rows[i])
				}
			}
		})
	}
}
