package imgproc

import (
	"fmt"
	"image/color"
	"math"
)

// Resize policies (Config.Policy).
const (
	// PolicyShorterCrop resizes the shorter side to Size (torchvision
	// Resize(Size) semantics: the longer side is int(Size*long/short)) and
	// centre-crops Size×Size with offsets round((H-Size)/2) (Python round,
	// half to even), like torchvision CenterCrop. The default.
	PolicyShorterCrop = "shorter-crop"
	// PolicySquare resizes to Size×Size, ignoring the aspect ratio.
	PolicySquare = "square"
	// PolicyDynamic keeps the aspect ratio; width and height are multiples
	// of PatchSize and the pixel count lies in [MinPixels, MaxPixels]
	// (Qwen2-VL smart_resize with factor = PatchSize).
	PolicyDynamic = "dynamic"
)

// Resampling filters (Config.Filter). Both are antialiased when
// downscaling: the kernel support is scaled by the downscale factor, exactly
// as Pillow's Image.resize does.
const (
	FilterBilinear = "bilinear" // triangle kernel, support 1
	FilterBicubic  = "bicubic"  // Keys cubic a=-0.5 (Catmull-Rom), support 2
)

// Output element types (Config.DType).
const (
	DTypeFloat16  = "float16"  // IEEE 754 binary16, round to nearest even
	DTypeFloat32  = "float32"  // IEEE 754 binary32
	DTypeBFloat16 = "bfloat16" // top 16 bits of binary32, round to nearest even
	DTypeUint8    = "uint8"    // raw RGB bytes, CHW; normalize on the GPU
)

// Normalization presets (Config.Norm).
const (
	NormImageNet = "imagenet"
	NormCLIP     = "clip"
	NormCustom   = "custom" // use Config.Mean and Config.Std
)

var (
	imagenetMean = [3]float32{0.485, 0.456, 0.406}
	imagenetStd  = [3]float32{0.229, 0.224, 0.225}
	clipMean     = [3]float32{0.48145466, 0.4578275, 0.40821073}
	clipStd      = [3]float32{0.26862954, 0.26130258, 0.27577711}
)

// Config controls decoding limits, the resize policy and the output
// encoding. The zero value is not valid; start from DefaultConfig.
type Config struct {
	// Policy is PolicyShorterCrop (default), PolicySquare or PolicyDynamic.
	Policy string
	// Size is the output side for PolicyShorterCrop and PolicySquare
	// (default 224). Ignored by PolicyDynamic.
	Size int
	// PatchSize is the vision encoder's patch side (default 16). It sets the
	// patch grid reported with every image and the rounding factor of
	// PolicyDynamic.
	PatchSize int
	// MinPixels and MaxPixels bound the output pixel count of
	// PolicyDynamic (defaults 56*56 and 28*28*1280, Qwen2-VL's).
	MinPixels, MaxPixels int
	// Filter is FilterBilinear (default) or FilterBicubic.
	Filter string
	// Norm selects the mean/std: NormImageNet (default), NormCLIP, or
	// NormCustom, which uses Mean and Std below.
	Norm string
	// Mean and Std, per RGB channel in 0..1 pixel units; used only when Norm
	// is NormCustom. Std must be non-zero.
	Mean, Std [3]float32
	// DType is DTypeFloat16 (default), DTypeFloat32, DTypeBFloat16 or
	// DTypeUint8. Float outputs are (x/255-mean)/std computed in float32.
	// DTypeJPEG and DTypeJPEGSource (wire.go) are lossy opt-in encodings
	// of the uint8 tensor.
	DType string
	// Background is composited under transparent pixels (default opaque
	// white). Its alpha is ignored.
	Background color.NRGBA
	// MaxImagePixels rejects images whose header declares more pixels, with
	// ErrTooLarge, before decoding (default 64<<20).
	MaxImagePixels int
	// MaxFileBytes rejects larger inputs with ErrTooLarge (default 64<<20).
	MaxFileBytes int
	// Decode is DecodeExact (default), DecodeFast or DecodeReduce. Exact
	// decodes every image at full size, so tensors are bit-identical to
	// Pillow/torchvision. Fast lets the libjpeg-turbo build decode JPEGs at
	// 1/2, 1/4 or 1/8 scale in the DCT domain (see JPEGDraftGap); other
	// formats, and the pure-Go build, decode at full size either way.
	// Reduce is Fast plus a box reduction of every format before the
	// resize (reduce.go): lossy, for the JPEG wire dtypes' worker CPU.
	Decode string
	// JPEGDraftGap is the safety factor of DecodeFast and DecodeReduce: the smallest DCT
	// scale is chosen whose result is still at least JPEGDraftGap times the
	// resize target on both axes. 1 (default) is Pillow's
	// draft(mode, size) rule; 2 is its thumbnail() reducing gap. In
	// [1, 64]; ignored by DecodeExact.
	JPEGDraftGap float64
	// Augment is the seeded augmentation ProcessSample applies (zero: none);
	// see augment.go and docs/augment.md. Left out of the JSON when zero,
	// so configs without it hash as before.
	Augment Augment `json:",omitzero"`
}

// Decode modes (Config.Decode).
const (
	// DecodeExact decodes at full size: tensors bit-identical to Pillow.
	DecodeExact = "exact"
	// DecodeFast decodes JPEGs scaled in the DCT domain (Pillow's draft()).
	DecodeFast = "fast"
	// DecodeReduce is DecodeFast plus a box reduction before the resize
	// (Pillow's reducing_gap 2; reduce.go), for every format.
	DecodeReduce = "reduce"
)

// draftGap is the gap the decoder uses: 0 (full size) unless DecodeFast or
// DecodeReduce.
func (c Config) draftGap() float64 {
	if c.Decode == DecodeFast || c.Decode == DecodeReduce {
		return c.JPEGDraftGap
	}
	return 0
}

// DefaultConfig returns shorter-crop 224, bilinear, ImageNet normalization,
// float16 output, white background, 64 MP and 64 MiB limits, exact decoding.
func DefaultConfig() Config {
	return Config{
		Policy:         PolicyShorterCrop,
		Size:           224,
		PatchSize:      16,
		MinPixels:      56 * 56,
		MaxPixels:      28 * 28 * 1280,
		Filter:         FilterBilinear,
		Norm:           NormImageNet,
		Mean:           imagenetMean,
		Std:            imagenetStd,
		DType:          DTypeFloat16,
		Background:     color.NRGBA{R: 255, G: 255, B: 255, A: 255},
		MaxImagePixels: 64 << 20,
		MaxFileBytes:   64 << 20,
		Decode:         DecodeExact,
		JPEGDraftGap:   1,
	}
}

// maxSide bounds every configured output side, so the tensor size stays sane.
const maxSide = 1 << 14

// Validate reports the first invalid field, wrapped around ErrConfig.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("imgproc: %s: %w", fmt.Sprintf(format, a...), ErrConfig)
	}
	switch c.Policy {
	case PolicyShorterCrop, PolicySquare:
		if c.Size < 1 || c.Size > maxSide {
			return bad("size %d not in [1, %d]", c.Size, maxSide)
		}
	case PolicyDynamic:
		if c.MinPixels < c.PatchSize*c.PatchSize || c.MaxPixels < c.MinPixels || c.MaxPixels > maxSide*maxSide {
			return bad("pixels range [%d, %d] invalid for patch %d", c.MinPixels, c.MaxPixels, c.PatchSize)
		}
	default:
		return bad("unknown policy %q", c.Policy)
	}
	if c.PatchSize < 1 || c.PatchSize > maxSide {
		return bad("patch size %d not in [1, %d]", c.PatchSize, maxSide)
	}
	if c.Filter != FilterBilinear && c.Filter != FilterBicubic {
		return bad("unknown filter %q", c.Filter)
	}
	switch c.Norm {
	case NormImageNet, NormCLIP, NormCustom:
	default:
		return bad("unknown norm %q", c.Norm)
	}
	_, std := c.MeanStd()
	for i, s := range std {
		if s == 0 || math.IsNaN(float64(s)) || math.IsInf(float64(s), 0) {
			return bad("std[%d] = %v", i, s)
		}
	}
	switch c.DType {
	case DTypeFloat16, DTypeFloat32, DTypeBFloat16, DTypeUint8, DTypeJPEG, DTypeJPEGSource:
	default:
		return bad("unknown dtype %q", c.DType)
	}
	if c.MaxImagePixels < 1 || c.MaxFileBytes < 1 {
		return bad("limits must be positive (pixels %d, bytes %d)", c.MaxImagePixels, c.MaxFileBytes)
	}
	if err := c.Augment.Validate(); err != nil {
		return err
	}
	if c.DType == DTypeJPEGSource && c.Augment.Enabled() {
		// The one mode that resizes on the trainer's device: the source bytes
		// pass through uncropped (docs/augment.md, "GPU modes").
		return bad("dtype %s sends the source's own bytes and resizes them on the trainer's device, so it cannot carry the crop augmentation draws: use dtype %s (the worker crops, then encodes)", DTypeJPEGSource, DTypeJPEG)
	}
	switch c.Decode {
	case DecodeExact:
	case DecodeFast, DecodeReduce:
		if !(c.JPEGDraftGap >= 1 && c.JPEGDraftGap <= 64) {
			return bad("jpeg draft gap %v not in [1, 64]", c.JPEGDraftGap)
		}
	default:
		return bad("unknown decode mode %q (want %s, %s or %s)", c.Decode, DecodeExact, DecodeFast, DecodeReduce)
	}
	return nil
}

// MeanStd returns the normalization parameters in effect: the preset's for
// NormImageNet and NormCLIP, Mean and Std for NormCustom.
func (c Config) MeanStd() (mean, std [3]float32) {
	switch c.Norm {
	case NormImageNet:
		return imagenetMean, imagenetStd
	case NormCLIP:
		return clipMean, clipStd
	}
	return c.Mean, c.Std
}

// ElemSize is the byte size of one output element for the DType (1 for the
// JPEG wire dtypes: the uint8 tensor before encoding).
func (c Config) ElemSize() int {
	switch c.pixelDType() {
	case DTypeFloat32:
		return 4
	case DTypeUint8:
		return 1
	}
	return 2
}
