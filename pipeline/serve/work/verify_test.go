package work

import (
	"errors"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/proto"
)

// verifyItem is a planned item of three samples for mp ranks of modality
// m (fixed 3×32×32 float16 images, or dynamic with shape nil), and rows a
// worker builds honestly for it.
func verifyItem(m proto.Modality, dynamic bool) (*BatchItem, []proto.Row) {
	meta := proto.BatchMeta{Job: "job-1", Epoch: 1, Step: 2, MicroBatch: 1, DPRank: 1, Modality: m, DType: proto.DTypeFloat16,
		Shape: []int{3, 32, 32}, Mean: [3]float32{0.5, 0.5, 0.5}, Std: [3]float32{0.25, 0.25, 0.25}, VocabSize: 30522}
	if dynamic {
		meta.Shape = nil
	}
	it := &BatchItem{Kind: "batch", Config: "c0ffee", Job: "job-1", Epoch: 1, Step: 2, DP: 1, MicroBatch: 1,
		Metas: []proto.BatchMeta{meta}, Samples: []Sample{
			{ID: "a", TextTokens: 3, ImageTokens: 4, Cost: 1.5, Weight: 1},
			{ID: "b", TextTokens: 5, ImageTokens: 4, Cost: 2.25, Weight: 1},
			{ID: "a", TextTokens: 3, ImageTokens: 4, Cost: 1.5, Weight: 0}, // a filler
		}}
	rows := make([]proto.Row, len(it.Samples))
	for i, s := range it.Samples {
		rows[i] = proto.Row{ID: s.ID, TextTokens: s.TextTokens, ImageTokens: s.ImageTokens, Cost: s.Cost, Weight: s.Weight,
			InputIDs: make([]int32, s.TextTokens), PixelShape: [3]int32{3, 32, 32}, Pixels: make([]byte, 3*32*32*2)}
	}
	return it, rows
}

// TestVerifyResult: a worker's result is kept only when it is what the
// item planned: honest rows pass, and so do the rows of a sample that
// failed on the worker (weight 0, zero pixels, no ids, one image token
// with dynamic resolution); every other change is rejected with its
// reason.
func TestVerifyResult(t *testing.T) {
	for _, tc := range []struct {
		name     string
		modality proto.Modality
		dynamic  bool
		config   string // "": the item's
		edit     func(meta *proto.BatchMeta, rows []proto.Row) []proto.Row
		payload  []byte // instead of the built record
		reason   string // "": accepted
	}{
		{name: "honest", modality: proto.ModalityAll},
		{name: "honest text", modality: proto.ModalityText},
		{name: "honest vision", modality: proto.ModalityVision},
		{name: "failed sample", modality: proto.ModalityAll, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row {
			r[1].Weight, r[1].InputIDs = 0, nil
			return r
		}},
		{name: "failed sample dynamic", modality: proto.ModalityAll, dynamic: true, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row {
			r[1].Weight, r[1].ImageTokens, r[1].PixelShape, r[1].Pixels = 0, 1, [3]int32{3, 16, 16}, make([]byte, 3*16*16*2)
			return r
		}},
		{name: "config", modality: proto.ModalityAll, config: "decaf", reason: RejectConfig},
		{name: "garbage", modality: proto.ModalityAll, payload: []byte("not arrow"), reason: RejectDecode},
		{name: "epoch", modality: proto.ModalityAll, edit: func(m *proto.BatchMeta, r []proto.Row) []proto.Row { m.Epoch++; return r }, reason: RejectSchema},
		{name: "step", modality: proto.ModalityAll, edit: func(m *proto.BatchMeta, r []proto.Row) []proto.Row { m.Step++; return r }, reason: RejectSchema},
		{name: "dp rank", modality: proto.ModalityAll, edit: func(m *proto.BatchMeta, r []proto.Row) []proto.Row { m.DPRank = 0; return r }, reason: RejectSchema},
		{name: "modality", modality: proto.ModalityAll, edit: func(m *proto.BatchMeta, r []proto.Row) []proto.Row { m.Modality = proto.ModalityText; return r }, reason: RejectSchema},
		{name: "normalization", modality: proto.ModalityAll, edit: func(m *proto.BatchMeta, r []proto.Row) []proto.Row { m.Std[0] = 1; return r }, reason: RejectSchema},
		{name: "vocabulary", modality: proto.ModalityText, edit: func(m *proto.BatchMeta, r []proto.Row) []proto.Row { m.VocabSize = 99; return r }, reason: RejectSchema},
		{name: "dtype", modality: proto.ModalityVision, edit: func(m *proto.BatchMeta, r []proto.Row) []proto.Row {
			m.DType = proto.DTypeUint8
			for i := range r {
				r[i].Pixels = r[i].Pixels[:len(r[i].Pixels)/2]
			}
			return r
		}, reason: RejectDType},
		{name: "fixed shape", modality: proto.ModalityAll, edit: func(m *proto.BatchMeta, r []proto.Row) []proto.Row {
			m.Shape = nil // claims dynamic resolution
			return r
		}, reason: RejectShape},
		{name: "row shape", modality: proto.ModalityVision, dynamic: true, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row {
			r[1].PixelShape, r[1].Pixels = [3]int32{3, 16, 64}, make([]byte, 3*16*64*2) // as many pixels, another resolution
			return r
		}, reason: RejectShape},
		{name: "missing row", modality: proto.ModalityAll, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row { return r[:2] }, reason: RejectRows},
		{name: "extra row", modality: proto.ModalityAll, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row { return append(r, r[1]) }, reason: RejectRows},
		{name: "no rows", modality: proto.ModalityText, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row { return nil }, reason: RejectRows},
		{name: "invented id", modality: proto.ModalityAll, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row { r[2].ID = "z"; return r }, reason: RejectIDs},
		{name: "a planned id twice", modality: proto.ModalityAll, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row { r[1].ID = "a"; return r }, reason: RejectIDs},
		{name: "order", modality: proto.ModalityAll, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row { r[0], r[1] = r[1], r[0]; return r }, reason: RejectOrder},
		{name: "text tokens", modality: proto.ModalityText, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row { r[1].TextTokens = 2; return r }, reason: RejectTokens},
		{name: "input ids", modality: proto.ModalityAll, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row { r[1].InputIDs = r[1].InputIDs[:2]; return r }, reason: RejectTokens},
		{name: "no ids, weight kept", modality: proto.ModalityAll, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row { r[1].InputIDs = nil; return r }, reason: RejectTokens},
		{name: "image tokens", modality: proto.ModalityVision, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row { r[0].ImageTokens = 9; return r }, reason: RejectTokens},
		{name: "cost", modality: proto.ModalityAll, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row { r[0].Cost = 0; return r }, reason: RejectValues},
		{name: "weight", modality: proto.ModalityAll, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row { r[0].Weight = 2; return r }, reason: RejectValues},
		{name: "filler weighted", modality: proto.ModalityAll, edit: func(_ *proto.BatchMeta, r []proto.Row) []proto.Row { r[2].Weight = 1; return r }, reason: RejectValues},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
			defer mem.AssertSize(t, 0)
			it, rows := verifyItem(tc.modality, tc.dynamic)
			meta := it.Metas[0]
			if tc.edit != nil {
				rows = tc.edit(&meta, rows)
			}
			payload := tc.payload
			if payload == nil {
				rec, err := proto.BuildRecord(mem, meta, rows)
				if err != nil {
					t.Fatal(err)
				}
				payload, err = proto.EncodeIPC(rec)
				rec.Release()
				if err != nil {
					t.Fatal(err)
				}
			}
			config := it.Config
			if tc.config != "" {
				config = tc.config
			}
			shapes := [][3]int32{{3, 32, 32}, {3, 32, 32}, {3, 32, 32}}
			err := VerifyResult(it, shapes, 0, config, payload)
			var re *ResultError
			switch {
			case tc.reason == "" && err != nil:
				t.Errorf("honest result rejected: %v", err)
			case tc.reason != "" && (!errors.As(err, &re) || re.reason != tc.reason):
				t.Errorf("got %v, want a rejection with reason %s", err, tc.reason)
			}
		})
	}
}
