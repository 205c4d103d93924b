package proto

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/apache/arrow-go/v18/arrow/float16"
)

// testMeta returns a BatchMeta for tests.
func testMeta(mod Modality, dtype string, shape []int) BatchMeta {
	return BatchMeta{Job: "job-1", Epoch: 2, Step: 7, MicroBatch: 1, DPRank: 1, MPRank: 0, Modality: mod,
		DType: dtype, Shape: shape, Mean: [3]float32{0.48145466, 0.4578275, 0.40821073}, Std: [3]float32{0.26862954, 0.26130258, 0.27577711}}
}

// pixelValue is the deterministic value of element j of row i, exactly
// representable in float16 and bfloat16 (k/64 for small k, with signs).
func pixelValue(i, j int) float32 {
	k := (i*131 + j*7) % 257
	return float32(k-128) / 64
}

// encodePixels encodes n elements of row i as little-endian dtype bytes.
func encodePixels(dtype string, i, n int) []byte {
	size := DTypeSize(dtype)
	b := make([]byte, n*size)
	for j := range n {
		v := pixelValue(i, j)
		switch dtype {
		case DTypeFloat16:
			binary.LittleEndian.PutUint16(b[2*j:], float16.New(v).Uint16())
		case DTypeBFloat16:
			binary.LittleEndian.PutUint16(b[2*j:], uint16(math.Float32bits(v)>>16))
		case DTypeFloat32:
			binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(v))
		case DTypeUint8:
			b[j] = byte((i*131 + j*7) % 256)
		}
	}
	return b
}

// testRows returns n rows for meta; with a dynamic shape each row has its
// own H and W.
func testRows(meta BatchMeta, n int) []Row {
	rows := make([]Row, n)
	for i := range rows {
		r := &rows[i]
		r.ID = fmt.Sprintf("sample-%03d", i)
		r.InputIDs = make([]int32, 1+i%5)
		for j := range r.InputIDs {
			r.InputIDs[j] = int32(101 + i*10 + j)
		}
		r.TextTokens = int32(len(r.InputIDs))
		r.Cost = 1.5 * float64(i+1)
		r.Weight = 1
		if i == n-1 && n > 1 {
			r.Weight = 0 // a padding sample
		}
		if meta.Modality.hasVision() {
			shape := [3]int32{3, int32(2 + i%3), int32(4 + i%2)}
			if meta.Shape != nil {
				shape = [3]int32{int32(meta.Shape[0]), int32(meta.Shape[1]), int32(meta.Shape[2])}
			}
			r.PixelShape = shape
			r.Pixels = encodePixels(meta.DType, i, int(shape[0]*shape[1]*shape[2]))
			r.ImageTokens = shape[1] * shape[2] / 2
		}
	}
	return rows
}

// project zeroes what modality m does not carry, as ReadRows returns it.
func project(m Modality, rows []Row) []Row {
	out := make([]Row, len(rows))
	for i, r := range rows {
		if !m.hasText() {
			r.InputIDs, r.TextTokens = nil, 0
		} else if r.InputIDs == nil {
			r.InputIDs = []int32{}
		}
		if !m.hasVision() {
			r.Pixels, r.PixelShape, r.ImageTokens = nil, [3]int32{}, 0
		} else if r.Pixels == nil {
			r.Pixels = []byte{}
		}
		out[i] = r
	}
	return out
}
