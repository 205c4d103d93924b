package proto

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/apache/arrow-go/v18/arrow"
)

// SchemaVersion is the value of the schema metadata key MetaSchemaVersion and
// of the Mmfeed-Schema header.
const SchemaVersion = "1"

// Column names (HuggingFace conventions).
const (
	ColID          = "id"
	ColStep        = "step"
	ColMicroBatch  = "micro_batch"
	ColInputIDs    = "input_ids"
	ColPixelValues = "pixel_values"
	ColPixelShape  = "pixel_shape"
	ColTextTokens  = "text_tokens"
	ColImageTokens = "image_tokens"
	ColCost        = "cost"
	ColWeight      = "weight"
)

// Schema-level metadata keys.
const (
	MetaSchemaVersion = "mmfeed.schema_version"
	MetaJob           = "mmfeed.job"
	MetaEpoch         = "mmfeed.epoch"
	MetaDPRank        = "mmfeed.dp_rank"
	MetaMPRank        = "mmfeed.mp_rank"
	MetaModality      = "mmfeed.modality"
	// MetaPack is "true" on the records of a job planned with --pack (the
	// trainer packs each micro-batch instead of padding it); absent otherwise.
	MetaPack = "mmfeed.pack"
	// MetaVocabSize and MetaPadID are the tokenizer's vocabulary size and pad
	// id (decimal); absent when unknown (BatchMeta.VocabSize, PadID).
	MetaVocabSize = "mmfeed.vocab_size"
	MetaPadID     = "mmfeed.pad_id"
)

// Field metadata keys on pixel_values.
const (
	FieldDType  = "dtype"
	FieldLayout = "layout"
	FieldShape  = "shape"
	FieldMean   = "mean"
	FieldStd    = "std"
)

// LayoutCHW is the only pixel layout: channel-major, row-major inside a plane.
const LayoutCHW = "CHW"

// Pixel element types (values of the dtype field metadata).
const (
	DTypeFloat16  = "float16"  // arrow float16 (IEEE half)
	DTypeFloat32  = "float32"  // arrow float32
	DTypeBFloat16 = "bfloat16" // arrow uint16 holding the bfloat16 bit pattern
	DTypeUint8    = "uint8"    // raw pixels; normalize with mean/std on the GPU
	// DTypeJPEG (shard files and the opt-in JPEG wire): each row's
	// pixel_values is one baseline JPEG of the resized, cropped RGB image
	// (pixel_shape is its decoded C,H,W); the reader decodes it to uint8 and
	// normalizes with mean/std like uint8. DTypeJPEGSource: jpegwire.go.
	DTypeJPEG = "jpeg"
)

// DTypeSize returns the byte size of one pixel element, or 0 for an unknown
// dtype.
func DTypeSize(dtype string) int {
	switch dtype {
	case DTypeFloat16, DTypeBFloat16:
		return 2
	case DTypeFloat32:
		return 4
	case DTypeUint8, DTypeJPEG, DTypeJPEGSource:
		return 1
	}
	return 0
}

// pixelElemType maps a dtype to the Arrow element type of pixel_values.
func pixelElemType(dtype string) (arrow.DataType, error) {
	switch dtype {
	case DTypeFloat16:
		return arrow.FixedWidthTypes.Float16, nil
	case DTypeFloat32:
		return arrow.PrimitiveTypes.Float32, nil
	case DTypeBFloat16:
		return arrow.PrimitiveTypes.Uint16, nil
	case DTypeUint8, DTypeJPEG, DTypeJPEGSource:
		return arrow.PrimitiveTypes.Uint8, nil
	}
	return nil, fmt.Errorf("proto: dtype %q (want float16|float32|bfloat16|uint8|jpeg|jpeg-source): %w", dtype, ErrInvalidMeta)
}

// Modality selects the columns a record carries.
type Modality string

// Modalities. Under modality placement the vision mp rank receives
// ModalityVision and the text mp rank ModalityText.
const (
	ModalityAll    Modality = "all"
	ModalityVision Modality = "vision"
	ModalityText   Modality = "text"
)

// Columns returns the column names of modality m in schema order, or nil for
// an unknown modality.
func (m Modality) Columns() []string {
	switch m {
	case ModalityAll:
		return []string{ColID, ColStep, ColMicroBatch, ColInputIDs, ColPixelValues, ColPixelShape,
			ColTextTokens, ColImageTokens, ColCost, ColWeight}
	case ModalityVision:
		return []string{ColID, ColStep, ColMicroBatch, ColPixelValues, ColPixelShape, ColImageTokens, ColCost, ColWeight}
	case ModalityText:
		return []string{ColID, ColStep, ColMicroBatch, ColInputIDs, ColTextTokens, ColCost, ColWeight}
	}
	return nil
}

func (m Modality) hasVision() bool { return m == ModalityAll || m == ModalityVision }
func (m Modality) hasText() bool   { return m == ModalityAll || m == ModalityText }

// ParseModality parses "all", "vision" or "text".
func ParseModality(s string) (Modality, error) {
	m := Modality(s)
	if m.Columns() == nil {
		return "", fmt.Errorf("proto: modality %q (want all|vision|text): %w", s, ErrInvalidMeta)
	}
	return m, nil
}

// Placements (the strings of balancer.Placement).
const (
	PlacementColocated = "colocated"
	PlacementModality  = "modality"
)

// ModalityFor returns the modality mp rank mpRank receives under placement
// with mp model-parallel ranks: modality placement needs mp == 2 and gives
// rank 0 vision and rank 1 text; colocated gives every rank all columns.
func ModalityFor(placement string, mp, mpRank int) (Modality, error) {
	if mp < 1 || mpRank < 0 || mpRank >= mp {
		return "", fmt.Errorf("proto: mp rank %d out of range [0,%d): %w", mpRank, mp, ErrLayout)
	}
	switch placement {
	case PlacementColocated:
		return ModalityAll, nil
	case PlacementModality:
		if mp != 2 {
			return "", fmt.Errorf("proto: placement modality needs mp=2 (vision rank 0, text rank 1), got mp=%d: %w", mp, ErrLayout)
		}
		if mpRank == 0 {
			return ModalityVision, nil
		}
		return ModalityText, nil
	}
	return "", fmt.Errorf("proto: placement %q (want colocated|modality): %w", placement, ErrLayout)
}

// columnType returns the Arrow type of column name for pixel dtype.
func columnType(name string, pix arrow.DataType) arrow.DataType {
	switch name {
	case ColID:
		return arrow.BinaryTypes.String
	case ColStep, ColMicroBatch, ColTextTokens, ColImageTokens:
		return arrow.PrimitiveTypes.Int32
	case ColInputIDs:
		return arrow.ListOf(arrow.PrimitiveTypes.Int32)
	case ColPixelValues:
		return arrow.ListOf(pix)
	case ColPixelShape:
		return arrow.FixedSizeListOf(3, arrow.PrimitiveTypes.Int32)
	case ColCost:
		return arrow.PrimitiveTypes.Float64
	case ColWeight:
		return arrow.PrimitiveTypes.Float32
	}
	return nil
}

// Schema returns the Arrow schema of records built for meta. Step and
// MicroBatch are columns, not schema metadata, so one schema serves a whole
// shard file of one (epoch, dp rank, mp rank).
func Schema(meta BatchMeta) (*arrow.Schema, error) {
	if err := meta.Validate(); err != nil {
		return nil, err
	}
	var pix arrow.DataType = arrow.PrimitiveTypes.Uint8
	if meta.Modality.hasVision() {
		pix, _ = pixelElemType(meta.DType)
	}
	cols := meta.Modality.Columns()
	fields := make([]arrow.Field, 0, len(cols))
	for _, name := range cols {
		f := arrow.Field{Name: name, Type: columnType(name, pix)}
		if name == ColPixelValues {
			f.Metadata = pixelMetadata(meta)
		}
		fields = append(fields, f)
	}
	fields = append(fields, keepFields(meta.Keep)...)
	keys := []string{MetaSchemaVersion, MetaJob, MetaEpoch, MetaDPRank, MetaMPRank, MetaModality}
	values := []string{SchemaVersion, meta.Job, strconv.Itoa(meta.Epoch), strconv.Itoa(meta.DPRank),
		strconv.Itoa(meta.MPRank), string(meta.Modality)}
	if meta.Pack {
		keys, values = append(keys, MetaPack), append(values, "true")
	}
	if meta.VocabSize > 0 {
		keys, values = append(keys, MetaVocabSize), append(values, strconv.Itoa(meta.VocabSize))
		if meta.PadID >= 0 {
			keys, values = append(keys, MetaPadID), append(values, strconv.Itoa(meta.PadID))
		}
	}
	md := arrow.NewMetadata(keys, values)
	return arrow.NewSchema(fields, &md), nil
}

func pixelMetadata(meta BatchMeta) arrow.Metadata {
	shape := "null"
	if meta.Shape != nil {
		b, _ := json.Marshal(meta.Shape)
		shape = string(b)
	}
	keys := []string{FieldDType, FieldLayout, FieldShape, FieldMean, FieldStd}
	values := []string{meta.DType, LayoutCHW, shape, floatsJSON(meta.Mean), floatsJSON(meta.Std)}
	if meta.Resize != "" {
		keys, values = append(keys, FieldResize), append(values, meta.Resize)
	}
	return arrow.NewMetadata(keys, values)
}

// floatsJSON formats float32s with the shortest representation that parses
// back to the same float32.
func floatsJSON(v [3]float32) string {
	b := []byte{'['}
	for i, f := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendFloat(b, float64(f), 'g', -1, 32)
	}
	return string(append(b, ']'))
}

// MetaFromSchema parses the schema and pixel_values metadata of s back into a
// BatchMeta (Step and MicroBatch are left zero: they are columns) and checks
// that the columns and their types are exactly those of the modality.
func MetaFromSchema(s *arrow.Schema) (BatchMeta, error) {
	var m BatchMeta
	md := s.Metadata()
	get := func(k string) string {
		if i := md.FindKey(k); i >= 0 {
			return md.Values()[i]
		}
		return ""
	}
	if v := get(MetaSchemaVersion); v != SchemaVersion {
		return m, fmt.Errorf("proto: schema version %q, want %q: %w", v, SchemaVersion, ErrSchema)
	}
	m.Job = get(MetaJob)
	switch v := get(MetaPack); v {
	case "", "false":
	case "true":
		m.Pack = true
	default:
		return m, fmt.Errorf("proto: schema metadata %s=%q (want true or absent): %w", MetaPack, v, ErrSchema)
	}
	if err := parseVocab(get, &m); err != nil {
		return m, err
	}
	var err error
	if m.Modality, err = ParseModality(get(MetaModality)); err != nil {
		return m, fmt.Errorf("%w: %w", err, ErrSchema)
	}
	for _, kv := range []struct {
		key string
		dst *int
	}{{MetaEpoch, &m.Epoch}, {MetaDPRank, &m.DPRank}, {MetaMPRank, &m.MPRank}} {
		if *kv.dst, err = strconv.Atoi(get(kv.key)); err != nil {
			return m, fmt.Errorf("proto: schema metadata %s=%q: %w", kv.key, get(kv.key), ErrSchema)
		}
	}
	if m.Modality.hasVision() {
		if err := parsePixelMeta(s, &m); err != nil {
			return m, err
		}
	}
	if m.Keep, err = parseKeepColumns(s); err != nil {
		return m, err
	}
	if err := m.Validate(); err != nil {
		return m, fmt.Errorf("%w: %w", err, ErrSchema)
	}
	want, _ := Schema(m)
	if err := sameFields(s, want); err != nil {
		return m, err
	}
	return m, nil
}

// parseVocab reads MetaVocabSize and MetaPadID (both optional; a pad id needs a vocabulary size).
func parseVocab(get func(string) string, m *BatchMeta) error {
	vs, pad := get(MetaVocabSize), get(MetaPadID)
	if vs == "" {
		if pad != "" {
			return fmt.Errorf("proto: schema metadata %s=%q without %s: %w", MetaPadID, pad, MetaVocabSize, ErrSchema)
		}
		return nil
	}
	var err error
	if m.VocabSize, err = strconv.Atoi(vs); err != nil || m.VocabSize <= 0 {
		return fmt.Errorf("proto: schema metadata %s=%q (want a positive integer): %w", MetaVocabSize, vs, ErrSchema)
	}
	if m.PadID = -1; pad == "" {
		return nil
	}
	if m.PadID, err = strconv.Atoi(pad); err != nil || m.PadID < 0 || m.PadID >= m.VocabSize {
		return fmt.Errorf("proto: schema metadata %s=%q (want an id in [0,%d)): %w", MetaPadID, pad, m.VocabSize, ErrSchema)
	}
	return nil
}

func parsePixelMeta(s *arrow.Schema, m *BatchMeta) error {
	idx := s.FieldIndices(ColPixelValues)
	if len(idx) != 1 {
		return fmt.Errorf("proto: schema has %d %s columns, want 1: %w", len(idx), ColPixelValues, ErrSchema)
	}
	fmd := s.Field(idx[0]).Metadata
	get := func(k string) string {
		if i := fmd.FindKey(k); i >= 0 {
			return fmd.Values()[i]
		}
		return ""
	}
	m.DType, m.Resize = get(FieldDType), get(FieldResize)
	if l := get(FieldLayout); l != LayoutCHW {
		return fmt.Errorf("proto: pixel layout %q, want %q: %w", l, LayoutCHW, ErrSchema)
	}
	if err := json.Unmarshal([]byte(get(FieldShape)), &m.Shape); err != nil {
		return fmt.Errorf("proto: pixel shape %q: %w", get(FieldShape), ErrSchema)
	}
	for _, kv := range []struct {
		key string
		dst *[3]float32
	}{{FieldMean, &m.Mean}, {FieldStd, &m.Std}} {
		var v []float32
		if err := json.Unmarshal([]byte(get(kv.key)), &v); err != nil || len(v) != 3 {
			return fmt.Errorf("proto: pixel %s %q (want 3 numbers): %w", kv.key, get(kv.key), ErrSchema)
		}
		copy(kv.dst[:], v)
	}
	return nil
}

// sameFields checks names and types (not metadata) field by field.
func sameFields(got, want *arrow.Schema) error {
	if got.NumFields() != want.NumFields() {
		return fmt.Errorf("proto: schema has columns %v, want %v: %w", fieldNames(got), fieldNames(want), ErrSchema)
	}
	for i := range want.NumFields() {
		g, w := got.Field(i), want.Field(i)
		if g.Name != w.Name || !arrow.TypeEqual(g.Type, w.Type) {
			return fmt.Errorf("proto: column %d is %s %s, want %s %s: %w", i, g.Name, g.Type, w.Name, w.Type, ErrSchema)
		}
	}
	return nil
}

func fieldNames(s *arrow.Schema) []string {
	out := make([]string, 0, s.NumFields())
	for _, f := range s.Fields() {
		out = append(out, f.Name)
	}
	return out
}

// Validate checks the BatchMeta fields that shape the schema and rows.
func (m BatchMeta) Validate() error {
	if err := ValidateJob(m.Job); err != nil {
		return err
	}
	if m.Modality.Columns() == nil {
		return fmt.Errorf("proto: modality %q (want all|vision|text): %w", m.Modality, ErrInvalidMeta)
	}
	for _, v := range []struct {
		name string
		v    int
	}{{"epoch", m.Epoch}, {"step", m.Step}, {"micro_batch", m.MicroBatch}, {"dp_rank", m.DPRank}, {"mp_rank", m.MPRank}} {
		if v.v < 0 || v.v > math.MaxInt32 {
			return fmt.Errorf("proto: %s %d out of range [0,2^31): %w", v.name, v.v, ErrInvalidMeta)
		}
	}
	if m.VocabSize < 0 || m.VocabSize > math.MaxInt32 || m.VocabSize > 0 && m.PadID >= m.VocabSize {
		return fmt.Errorf("proto: vocab size %d, pad id %d (want pad id < vocab size, or vocab size 0 for unknown): %w", m.VocabSize, m.PadID, ErrInvalidMeta)
	}
	if err := validateKeep(m.Keep); err != nil {
		return err
	}
	if !m.Modality.hasVision() {
		return nil
	}
	if _, err := pixelElemType(m.DType); err != nil {
		return err
	}
	if err := m.validateResize(); err != nil {
		return err
	}
	if m.Shape != nil {
		if len(m.Shape) != 3 || slices.ContainsFunc(m.Shape, func(d int) bool { return d <= 0 || d > math.MaxInt32 }) {
			return fmt.Errorf("proto: fixed shape %v (want 3 positive dims C,H,W or nil for dynamic): %w", m.Shape, ErrInvalidMeta)
		}
	}
	for i, s := range m.Std {
		if (m.DType == DTypeUint8 || IsJPEGDType(m.DType)) && (s == 0 || math.IsNaN(float64(s))) {
			return fmt.Errorf("proto: std[%d]=%v with dtype uint8 (the trainer divides by it): %w", i, s, ErrInvalidMeta)
		}
	}
	return nil
}

// MaxJPEGOverhead bounds a DTypeJPEG row beyond 2 bytes per pixel value:
// headers and tables of a baseline JPEG. Longer rows are rejected.
const MaxJPEGOverhead = 4096
