package pipeline

import (
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/color"
	"math"
	"os"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/mmfeed/mmfeed/tokenize"
)

// ErrNoStep: the shard holds no micro-batch of the requested step.
var ErrNoStep = errors.New("pipeline: step not in the shard")

// SheetSample is one sample a rank received, as `mmfeed inspect` shows it.
type SheetSample struct {
	MicroBatch  int
	ID          string
	TextTokens  int
	ImageTokens int
	Cost        float64
	// Weight is 0 for the padding samples that keep ranks at equal work.
	Weight float32
	// Caption is the text decoded from the ids the rank received ("" when
	// it received none).
	Caption string
	// Image is the tensor the rank received, de-normalized to 8-bit RGB
	// (nil when it received no pixels).
	Image *image.NRGBA
}

// ReadRankStep reads the micro-batches of step from one rank's shard file
// (RankFile), de-normalizing each image from its tensor with the field
// metadata (dtype, shape, mean, std) and decoding each caption with tk (nil:
// no captions).
func ReadRankStep(path string, step int, tk *tokenize.Tokenizer) ([]SheetSample, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := ipc.NewFileReader(f, ipc.WithAllocator(memory.NewGoAllocator()))
	if err != nil {
		return nil, fmt.Errorf("pipeline: inspect %s: %w", path, err)
	}
	defer r.Close()
	var out []SheetSample
	for i := range r.NumRecords() {
		rec, err := r.RecordBatch(i)
		if err != nil {
			return nil, fmt.Errorf("pipeline: inspect %s record %d: %w", path, i, err)
		}
		if st, ok := stepOf(rec.Column(rec.Schema().FieldIndices("step")[0])); !ok || st != step {
			continue
		}
		meta, rows, err := proto.ReadRows(rec)
		if err != nil {
			return nil, fmt.Errorf("pipeline: inspect %s record %d: %w", path, i, err)
		}
		for _, row := range rows {
			s := SheetSample{MicroBatch: meta.MicroBatch, ID: row.ID, TextTokens: int(row.TextTokens), ImageTokens: int(row.ImageTokens),
				Cost: row.Cost, Weight: row.Weight}
			if len(row.Pixels) > 0 {
				if s.Image, err = TensorImage(meta, row); err != nil {
					return nil, fmt.Errorf("pipeline: inspect %s sample %s: %w", path, row.ID, err)
				}
			}
			if tk != nil && len(row.InputIDs) > 0 {
				if s.Caption, err = tk.Decode(row.InputIDs); err != nil {
					return nil, err
				}
			}
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s step %d: %w", path, step, ErrNoStep)
	}
	return out, nil
}

// stepOf reads the step column of a micro-batch record (every row has the same).
func stepOf(col any) (int, bool) {
	c, ok := col.(*array.Int32)
	if !ok || c.Len() == 0 {
		return 0, false
	}
	return int(c.Value(0)), true
}

// maxTensorSide bounds a tensor side TensorImage accepts (the products of
// larger sides could overflow the size check).
const maxTensorSide = 1 << 15

// TensorImage turns a row's CHW tensor back into the picture the trainer
// sees: float pixels are un-normalized (x·std + mean), uint8 pixels are
// taken as they are, then clamped to 8 bits. Grey (1 channel) is shown grey.
func TensorImage(meta proto.BatchMeta, row proto.Row) (*image.NRGBA, error) {
	c, h, w := int(row.PixelShape[0]), int(row.PixelShape[1]), int(row.PixelShape[2])
	size := map[string]int{proto.DTypeFloat16: 2, proto.DTypeBFloat16: 2, proto.DTypeFloat32: 4, proto.DTypeUint8: 1}[meta.DType]
	if size == 0 || c < 1 || c > 3 || h < 1 || w < 1 || h > maxTensorSide || w > maxTensorSide || len(row.Pixels) != c*h*w*size {
		return nil, fmt.Errorf("pipeline: tensor %s of shape %v, %d bytes: %w", meta.DType, row.PixelShape, len(row.Pixels), proto.ErrInvalidRow)
	}
	value := func(i, ch int) float64 {
		b := row.Pixels[i*size:]
		switch meta.DType {
		case proto.DTypeUint8:
			return float64(b[0]) / 255
		case proto.DTypeFloat32:
			return float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))*float64(meta.Std[ch]) + float64(meta.Mean[ch])
		case proto.DTypeBFloat16:
			return float64(imgproc.BFloat16ToFloat32(binary.LittleEndian.Uint16(b)))*float64(meta.Std[ch]) + float64(meta.Mean[ch])
		default:
			return float64(imgproc.Float16ToFloat32(binary.LittleEndian.Uint16(b)))*float64(meta.Std[ch]) + float64(meta.Mean[ch])
		}
	}
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	plane := h * w
	for y := range h {
		for x := range w {
			var px [3]uint8
			for ch := range 3 {
				src := min(ch, c-1)
				px[ch] = to8(value(src*plane+y*w+x, src))
			}
			img.SetNRGBA(x, y, color.NRGBA{px[0], px[1], px[2], 255})
		}
	}
	return img, nil
}

func to8(v float64) uint8 {
	if !(v > 0) {
		return 0
	}
	return uint8(math.Min(255, math.Round(v*255)))
}
