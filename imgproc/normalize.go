package imgproc

import (
	"encoding/binary"
	"math"
)

// normalizer turns packed RGB bytes into the output tensor through a lookup
// table per channel: (v/255 - mean)/std is evaluated once per byte value in
// float32, exactly as torchvision's ToTensor + Normalize do, then encoded.
type normalizer struct {
	dtype string
	lut16 [3][256]uint16
	lut32 [3][256]uint32
}

func newNormalizer(dtype string, mean, std [3]float32) *normalizer {
	n := &normalizer{dtype: dtype}
	for c := range 3 {
		for v := range 256 {
			f := (float32(v)/255 - mean[c]) / std[c]
			n.lut32[c][v] = math.Float32bits(f)
			switch dtype {
			case DTypeFloat16:
				n.lut16[c][v] = Float32ToFloat16(f)
			case DTypeBFloat16:
				n.lut16[c][v] = Float32ToBFloat16(f)
			}
		}
	}
	return n
}

// encode writes the CHW tensor of packed RGB pix (w×h) into dst, which must
// hold 3*w*h*elemSize bytes; little-endian.
func (n *normalizer) encode(pix []byte, w, h int, dst []byte) {
	plane := w * h
	switch n.dtype {
	case DTypeUint8:
		for c := range 3 {
			out := dst[c*plane : (c+1)*plane]
			for i := range out {
				out[i] = pix[3*i+c]
			}
		}
	case DTypeFloat32:
		for c := range 3 {
			lut := &n.lut32[c]
			out := dst[4*c*plane : 4*(c+1)*plane]
			for i := range plane {
				binary.LittleEndian.PutUint32(out[4*i:], lut[pix[3*i+c]])
			}
		}
	default:
		for c := range 3 {
			lut := &n.lut16[c]
			out := dst[2*c*plane : 2*(c+1)*plane]
			for i := range plane {
				binary.LittleEndian.PutUint16(out[2*i:], lut[pix[3*i+c]])
			}
		}
	}
}
