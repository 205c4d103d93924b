package proto

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// Row is one sample of a micro-batch, the input of BuildRecord.
type Row struct {
	ID string
	// InputIDs are the token ids, unpadded (text and all modalities).
	InputIDs []int32
	// Pixels is the image tensor as little-endian bytes of the batch dtype,
	// CHW row-major, exactly C*H*W*DTypeSize bytes (vision and all).
	Pixels []byte
	// PixelShape is C,H,W of Pixels; it must equal BatchMeta.Shape when the
	// batch has a fixed shape.
	PixelShape  [3]int32
	TextTokens  int32
	ImageTokens int32
	// Cost is the balancer's cost estimate of the sample.
	Cost float64
	// Weight is the sample's loss weight: 1 for real samples, 0 for the
	// padding samples that keep ranks at equal work units.
	Weight float32
	// Keep holds one value per BatchMeta.Keep column, or none: every kept
	// column null (padding rows).
	Keep []KeepValue
}

// BatchMeta describes one micro-batch: who it is for and how its pixels are
// encoded.
type BatchMeta struct {
	Job                     string
	Epoch, Step, MicroBatch int
	DPRank, MPRank          int
	Modality                Modality
	// DType is the pixel element type (DTypeFloat16, ...); vision and all only.
	DType string
	// Shape is the fixed C,H,W of every image, or nil for dynamic resolution.
	Shape []int
	// Mean and Std are the per-channel normalization: with uint8 pixels the
	// trainer applies (x/255 - mean)/std; float pixels are already normalized
	// with them.
	Mean, Std [3]float32
	// Pack says the job was planned for packed micro-batches (schema
	// metadata MetaPack); the rows are the same either way.
	Pack bool
	// VocabSize and PadID are the tokenizer's (schema metadata MetaVocabSize
	// and MetaPadID): the trainer pads input_ids with PadID and refuses a
	// model whose vocabulary is smaller. VocabSize 0: unknown, both keys
	// absent. PadID < 0: the tokenizer has no pad token, MetaPadID absent.
	VocabSize, PadID int
	// Keep are the kept columns (source fields carried through, see
	// keep.go), after the modality's columns; none by default.
	Keep []KeepColumn `json:",omitempty"`
	// Resize is "<policy>/<filter>" under DTypeJPEGSource (FieldResize),
	// empty otherwise.
	Resize string `json:",omitempty"`
}

// BuildRecord builds the record of one micro-batch. Every row gets
// meta.Step and meta.MicroBatch in the step and micro_batch columns. The
// caller releases the record. Rows are validated first: a bad row gives an
// ErrInvalidRow error naming its index and id, and no record.
func BuildRecord(mem memory.Allocator, meta BatchMeta, rows []Row) (arrow.RecordBatch, error) {
	schema, err := Schema(meta)
	if err != nil {
		return nil, err
	}
	if err := validateRows(meta, rows); err != nil {
		return nil, err
	}
	cols := make([]arrow.Array, 0, schema.NumFields())
	defer func() {
		for _, c := range cols {
			c.Release()
		}
	}()
	nk := len(meta.Keep)
	for _, f := range schema.Fields()[:schema.NumFields()-nk] {
		col, err := buildColumn(mem, f, meta, rows)
		if err != nil {
			return nil, err
		}
		cols = append(cols, col)
	}
	for i := range nk {
		cols = append(cols, buildKeep(mem, meta, i, rows))
	}
	return array.NewRecordBatch(schema, cols, int64(len(rows))), nil
}

func validateRows(meta BatchMeta, rows []Row) error {
	if len(rows) > math.MaxInt32 {
		return fmt.Errorf("proto: %d rows: %w", len(rows), ErrTooLarge)
	}
	var ids, pix int64
	for i := range rows {
		r := &rows[i]
		if len(r.Keep) != 0 && len(r.Keep) != len(meta.Keep) {
			return fmt.Errorf("proto: row %d (id %q): %d kept values for %d kept columns: %w", i, r.ID, len(r.Keep), len(meta.Keep), ErrInvalidRow)
		}
		if err := validateRow(meta, r); err != nil {
			return fmt.Errorf("proto: row %d (id %q): %w", i, r.ID, err)
		}
		ids += int64(len(r.InputIDs))
		pix += int64(len(r.Pixels) / max(1, DTypeSize(meta.DType)))
	}
	if ids > math.MaxInt32 || pix > math.MaxInt32 {
		return fmt.Errorf("proto: batch has %d token ids and %d pixel elements (limit 2^31-1 each): %w", ids, pix, ErrTooLarge)
	}
	return nil
}

func validateRow(meta BatchMeta, r *Row) error {
	if r.TextTokens < 0 || r.ImageTokens < 0 {
		return fmt.Errorf("negative token count (text %d, image %d): %w", r.TextTokens, r.ImageTokens, ErrInvalidRow)
	}
	if math.IsNaN(r.Cost) || math.IsInf(r.Cost, 0) || r.Cost < 0 {
		return fmt.Errorf("cost %v not a finite non-negative number: %w", r.Cost, ErrInvalidRow)
	}
	if w := float64(r.Weight); math.IsNaN(w) || math.IsInf(w, 0) || w < 0 {
		return fmt.Errorf("weight %v not a finite non-negative number: %w", r.Weight, ErrInvalidRow)
	}
	if !meta.Modality.hasVision() {
		return nil
	}
	n := int64(1)
	for _, d := range r.PixelShape {
		if d < 0 {
			return fmt.Errorf("pixel shape %v has a negative dim: %w", r.PixelShape, ErrInvalidRow)
		}
		n *= int64(d)
	}
	if meta.Shape != nil && (int(r.PixelShape[0]) != meta.Shape[0] || int(r.PixelShape[1]) != meta.Shape[1] || int(r.PixelShape[2]) != meta.Shape[2]) {
		return fmt.Errorf("pixel shape %v differs from the batch's fixed shape %v: %w", r.PixelShape, meta.Shape, ErrInvalidRow)
	}
	if IsJPEGDType(meta.DType) {
		return validateJPEGRow(meta.DType, r.PixelShape[:], n, int64(len(r.Pixels)))
	}
	if want := n * int64(DTypeSize(meta.DType)); int64(len(r.Pixels)) != want {
		return fmt.Errorf("%d pixel bytes, want %d for shape %v of %s: %w", len(r.Pixels), want, r.PixelShape, meta.DType, ErrInvalidRow)
	}
	return nil
}

func buildColumn(mem memory.Allocator, f arrow.Field, meta BatchMeta, rows []Row) (arrow.Array, error) {
	switch f.Name {
	case ColID:
		b := array.NewStringBuilder(mem)
		defer b.Release()
		for i := range rows {
			b.Append(rows[i].ID)
		}
		return b.NewArray(), nil
	case ColStep, ColMicroBatch, ColTextTokens, ColImageTokens:
		return buildInt32(mem, f.Name, meta, rows), nil
	case ColInputIDs:
		return buildInputIDs(mem, rows), nil
	case ColPixelValues:
		return buildPixels(mem, f.Type.(*arrow.ListType), meta, rows), nil
	case ColPixelShape:
		return buildPixelShape(mem, rows), nil
	case ColCost:
		b := array.NewFloat64Builder(mem)
		defer b.Release()
		b.Reserve(len(rows))
		for i := range rows {
			b.UnsafeAppend(rows[i].Cost)
		}
		return b.NewArray(), nil
	case ColWeight:
		b := array.NewFloat32Builder(mem)
		defer b.Release()
		b.Reserve(len(rows))
		for i := range rows {
			b.UnsafeAppend(rows[i].Weight)
		}
		return b.NewArray(), nil
	}
	return nil, fmt.Errorf("proto: no builder for column %q: %w", f.Name, ErrSchema)
}

func buildInt32(mem memory.Allocator, name string, meta BatchMeta, rows []Row) arrow.Array {
	b := array.NewInt32Builder(mem)
	defer b.Release()
	b.Reserve(len(rows))
	for i := range rows {
		var v int32
		switch name {
		case ColStep:
			v = int32(meta.Step)
		case ColMicroBatch:
			v = int32(meta.MicroBatch)
		case ColTextTokens:
			v = rows[i].TextTokens
		case ColImageTokens:
			v = rows[i].ImageTokens
		}
		b.UnsafeAppend(v)
	}
	return b.NewArray()
}

func buildInputIDs(mem memory.Allocator, rows []Row) arrow.Array {
	b := array.NewListBuilder(mem, arrow.PrimitiveTypes.Int32)
	defer b.Release()
	vb := b.ValueBuilder().(*array.Int32Builder)
	b.Reserve(len(rows))
	for i := range rows {
		b.Append(true)
		vb.AppendValues(rows[i].InputIDs, nil)
	}
	return b.NewArray()
}

// buildPixels assembles the list<elem> array from the rows' raw bytes with a
// single copy per row: the values buffer is the concatenation of the
// little-endian tensors, which is Arrow's own (little-endian) layout.
func buildPixels(mem memory.Allocator, lt *arrow.ListType, meta BatchMeta, rows []Row) arrow.Array {
	size := DTypeSize(meta.DType)
	total := 0
	for i := range rows {
		total += len(rows[i].Pixels)
	}
	values := memory.NewResizableBuffer(mem)
	values.Resize(total)
	offsets := memory.NewResizableBuffer(mem)
	offsets.Resize((len(rows) + 1) * arrow.Int32SizeBytes)
	vb, ob := values.Bytes(), offsets.Bytes()
	pos := 0
	for i := range rows {
		binary.LittleEndian.PutUint32(ob[i*4:], uint32(pos/size))
		pos += copy(vb[pos:], rows[i].Pixels)
	}
	binary.LittleEndian.PutUint32(ob[len(rows)*4:], uint32(pos/size))
	vdata := array.NewData(lt.Elem(), total/size, []*memory.Buffer{nil, values}, nil, 0, 0)
	ldata := array.NewData(lt, len(rows), []*memory.Buffer{nil, offsets}, []arrow.ArrayData{vdata}, 0, 0)
	values.Release()
	offsets.Release()
	vdata.Release()
	defer ldata.Release()
	return array.MakeFromData(ldata)
}

func buildPixelShape(mem memory.Allocator, rows []Row) arrow.Array {
	b := array.NewFixedSizeListBuilder(mem, 3, arrow.PrimitiveTypes.Int32)
	defer b.Release()
	vb := b.ValueBuilder().(*array.Int32Builder)
	b.Reserve(len(rows))
	vb.Reserve(3 * len(rows))
	for i := range rows {
		b.Append(true)
		vb.AppendValues(rows[i].PixelShape[:], nil)
	}
	return b.NewArray()
}

// EncodeIPC writes rec as one Arrow IPC stream (schema message, one record
// batch message, end-of-stream marker). It does not release rec.
func EncodeIPC(rec arrow.RecordBatch) ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(int(estimateSize(rec)) + 4096)
	w := ipc.NewWriter(&buf, ipc.WithSchema(rec.Schema()))
	if err := w.Write(rec); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("proto: encode ipc: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("proto: encode ipc: %w", err)
	}
	return buf.Bytes(), nil
}

func estimateSize(rec arrow.RecordBatch) int64 {
	var n int64
	for _, c := range rec.Columns() {
		n += int64(c.Data().SizeInBytes())
	}
	return n
}

// DecodeIPC reads the record of an IPC stream written by EncodeIPC and
// checks it against the mmfeed schema (ValidateRecord). The stream's framing
// and flatbuffer lengths are checked before arrow-go parses it, so a
// malformed payload gives an ErrSchema error, never a huge allocation.
// Zero-copy: the record's buffers alias b, so b must not change while the
// record is alive; mem serves only what decoding has to allocate. The caller
// releases the record.
func DecodeIPC(mem memory.Allocator, b []byte) (rec arrow.RecordBatch, err error) {
	return decodeIPC(mem, b, nil)
}

// decodeIPC is DecodeIPC; release, when not nil, is called once when nothing
// decoded from b references it any more (the record and its arrays were
// released, or decoding failed after reading the record batch), so b can be
// reused.
func decodeIPC(mem memory.Allocator, b []byte, release func()) (rec arrow.RecordBatch, err error) {
	defer func() { // arrow's reader may still panic on malformed data
		if p := recover(); p != nil {
			if rec != nil {
				rec.Release()
			}
			rec, err = nil, fmt.Errorf("proto: decode ipc: malformed payload (%v): %w", p, ErrSchema)
		}
	}()
	frames, err := checkIPCFraming(b)
	if err != nil {
		return nil, fmt.Errorf("proto: decode ipc: %w", err)
	}
	fr := &frameReader{frames: frames}
	if release != nil {
		fr.owner = &payloadOwner{release: release}
	}
	r, err := ipc.NewReaderFromMessageReader(fr, ipc.WithAllocator(mem))
	if err != nil {
		return nil, fmt.Errorf("proto: decode ipc: %w: %w", err, ErrSchema)
	}
	defer r.Release()
	if _, err := MetaFromSchema(r.Schema()); err != nil {
		return nil, fmt.Errorf("proto: decode ipc: %w", err)
	}
	if !r.Next() {
		return nil, fmt.Errorf("proto: decode ipc: no record batch (%v): %w", r.Err(), ErrSchema)
	}
	rec = r.RecordBatch()
	rec.Retain()
	if _, err := ValidateRecord(rec); err != nil {
		rec.Release()
		return nil, fmt.Errorf("proto: decode ipc: %w", err)
	}
	return rec, nil
}

// payloadOwner is the allocator of a decoded payload's body buffer: arrow
// calls Free when the buffer's last reference is released.
type payloadOwner struct {
	once    sync.Once
	release func()
}

func (o *payloadOwner) Allocate(n int) []byte { return make([]byte, n) }

func (o *payloadOwner) Reallocate(n int, b []byte) []byte {
	out := make([]byte, n)
	copy(out, b)
	return out
}

func (o *payloadOwner) Free([]byte) { o.once.Do(o.release) }
