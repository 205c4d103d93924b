package pipeline

import (
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/proto"
)

// PixelEncoding returns the batch metadata of images processed with c: the
// pixel dtype and, under the jpeg-source wire dtype, the resize the trainer
// applies ("<policy>/<filter>", proto.FieldResize).
func PixelEncoding(c imgproc.Config) (dtype, resize string) {
	if c.DType == imgproc.DTypeJPEGSource {
		return c.DType, c.Policy + "/" + c.Filter
	}
	return c.DType, ""
}

// JPEGSourceCounts are the images a Preprocessor sent under the jpeg-source
// wire dtype: as the source's own bytes, or re-encoded at the planned size
// because the source was not an acceptable JPEG (imgproc.SourceJPEGAcceptable).
type JPEGSourceCounts struct {
	Source, Fallback int64
}

// JPEGSourceCounts returns the counts so far (zero unless the image dtype is
// jpeg-source).
func (pp *Preprocessor) JPEGSourceCounts() JPEGSourceCounts {
	return JPEGSourceCounts{Source: pp.jpegSource.Load(), Fallback: pp.jpegFallback.Load()}
}

// countJPEGSource counts one processed image under the jpeg-source dtype.
func (pp *Preprocessor) countJPEGSource(img imgproc.Image) {
	if pp.prep.Config.Image.DType != imgproc.DTypeJPEGSource {
		return
	}
	if img.Source {
		pp.jpegSource.Add(1)
	} else {
		pp.jpegFallback.Add(1)
	}
}

// zeroPixels is the pixel bytes of a failed sample's h×w placeholder: zeros
// of the tensor dtype, or the JPEG of a black image under a JPEG wire dtype.
func zeroPixels(c imgproc.Config, h, w int) []byte {
	if !proto.IsJPEGDType(c.DType) {
		return make([]byte, 3*h*w*c.ElemSize())
	}
	b, err := imgproc.ZeroJPEG(h, w)
	if err != nil { // h, w are the configured sizes, validated: cannot fail
		panic("pipeline: zero jpeg: " + err.Error())
	}
	return b
}
