package loader

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// The Arrow library trusts the lengths inside an IPC message's metadata (a
// flatbuffer): a forged schema's field count or a batch's variadic buffer
// count is allocated as given (tens of GiB, a fatal out-of-memory, not a
// panic), and a field's children may point back at it. checkedMessages
// therefore frames the stream itself and checks every message's metadata
// before the library sees it: each vector fits in the metadata, fields nest
// at most maxFieldDepth deep and number at most maxFields in all (counted as
// the library walks them, shared subtrees again each time), variadic
// buffer counts fit the batch's buffers, bodies are uncompressed and fit
// both Options.MaxRowGroupBytes and what is left of the file.

const (
	maxFieldDepth = 64
	maxFields     = 1 << 14
)

// errBadMetadata wraps a message the checks refuse.
var errBadMetadata = errors.New("bad IPC message metadata")

// checkedMessages is an ipc.MessageReader over an arrowReader.
type checkedMessages struct {
	r       *arrowReader
	size    int64 // the file's size
	maxBody int64
}

func (m *checkedMessages) Retain()  {}
func (m *checkedMessages) Release() {}

// Message reads the next message; io.EOF at the end-of-stream marker or the
// end of the file.
func (m *checkedMessages) Message() (*ipc.Message, error) {
	var word [4]byte
	if _, err := io.ReadFull(m.r, word[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, err
	}
	n := binary.LittleEndian.Uint32(word[:])
	if n == 0xFFFFFFFF {
		if _, err := io.ReadFull(m.r, word[:]); err != nil {
			return nil, fmt.Errorf("%w: message length: %v", errBadMetadata, err)
		}
		n = binary.LittleEndian.Uint32(word[:])
	}
	if n == 0 {
		return nil, io.EOF
	}
	if n < 8 || n > maxArrowMetadata {
		return nil, fmt.Errorf("%w: metadata of %d bytes", errBadMetadata, n)
	}
	meta := make([]byte, n)
	if _, err := io.ReadFull(m.r, meta); err != nil {
		return nil, fmt.Errorf("%w: metadata: %v", errBadMetadata, err)
	}
	bodyLen, err := checkMessage(fbuf(meta))
	if err != nil {
		return nil, err
	}
	if bodyLen > m.maxBody {
		return nil, fmt.Errorf("arrow message body length %d exceeds limit %d (MaxRowGroupBytes)", bodyLen, m.maxBody)
	}
	if bodyLen > m.size-m.r.pos {
		return nil, fmt.Errorf("%w: body of %d bytes, %d left in the file", errBadMetadata, bodyLen, m.size-m.r.pos)
	}
	body := make([]byte, bodyLen)
	if _, err := io.ReadFull(m.r, body); err != nil {
		return nil, fmt.Errorf("%w: body: %v", errBadMetadata, err)
	}
	mb, bb := memory.NewBufferBytes(meta), memory.NewBufferBytes(body)
	msg := ipc.NewMessage(mb, bb)
	mb.Release()
	bb.Release()
	return msg, nil
}

// fbuf reads a flatbuffer with every offset checked.
type fbuf []byte

func (b fbuf) u32(off int64) (int64, bool) {
	if off < 0 || off+4 > int64(len(b)) {
		return 0, false
	}
	return int64(binary.LittleEndian.Uint32(b[off:])), true
}

func (b fbuf) i64(off int64) (int64, bool) {
	if off < 0 || off+8 > int64(len(b)) {
		return 0, false
	}
	return int64(binary.LittleEndian.Uint64(b[off:])), true
}

func (b fbuf) u8(off int64) (byte, bool) {
	if off < 0 || off >= int64(len(b)) {
		return 0, false
	}
	return b[off], true
}

// field returns where field i of the table at tab lies (0: absent).
func (b fbuf) field(tab int64, i int) (int64, error) {
	soff, ok := b.u32(tab)
	if !ok {
		return 0, fmt.Errorf("%w: table at %d", errBadMetadata, tab)
	}
	vt := tab - int64(int32(uint32(soff)))
	if vt < 0 || vt+4 > int64(len(b)) {
		return 0, fmt.Errorf("%w: vtable at %d", errBadMetadata, vt)
	}
	vsize := int64(binary.LittleEndian.Uint16(b[vt:]))
	slot := 4 + 2*int64(i)
	if slot+2 > vsize || vt+slot+2 > int64(len(b)) {
		return 0, nil
	}
	rel := int64(binary.LittleEndian.Uint16(b[vt+slot:]))
	if rel == 0 {
		return 0, nil
	}
	return tab + rel, nil
}

// ref follows the offset stored at field i of tab (0: absent).
func (b fbuf) ref(tab int64, i int) (int64, error) {
	at, err := b.field(tab, i)
	if err != nil || at == 0 {
		return 0, err
	}
	off, ok := b.u32(at)
	if !ok || at+off >= int64(len(b)) {
		return 0, fmt.Errorf("%w: offset at %d", errBadMetadata, at)
	}
	return at + off, nil
}

// vector returns the first element and length of the vector at field i of
// tab, checked to fit with elements of size elem (n 0: absent).
func (b fbuf) vector(tab int64, i int, elem int64) (start, n int64, err error) {
	at, err := b.ref(tab, i)
	if err != nil || at == 0 {
		return 0, 0, err
	}
	n, ok := b.u32(at)
	if !ok || at+4+n*elem > int64(len(b)) {
		return 0, 0, fmt.Errorf("%w: vector of %d × %d bytes at %d", errBadMetadata, n, elem, at)
	}
	return at + 4, n, nil
}

// tables calls f for each table of the vector at field i of tab.
func (b fbuf) tables(tab int64, i int, f func(int64) error) error {
	start, n, err := b.vector(tab, i, 4)
	for k := int64(0); err == nil && k < n; k++ {
		off, _ := b.u32(start + 4*k)
		err = f(start + 4*k + off)
	}
	return err
}

// Message, Schema, Field, RecordBatch and Union field slots (Message.fbs,
// Schema.fbs) and header types.
const (
	msgHeaderType, msgHeader, msgBodyLength, msgMetadata = 1, 2, 3, 4
	schemaFields, schemaMetadata, schemaFeatures         = 1, 2, 3
	fieldTypeType, fieldType, fieldChildren, fieldMeta   = 2, 3, 5, 6
	rbNodes, rbBuffers, rbCompression, rbVariadic        = 1, 2, 3, 4
	dictData                                             = 1
	unionTypeIDs                                         = 1
	headerSchema, headerDictionary, headerRecordBatch    = 1, 2, 3
	typeUnion                                            = 14
)

// checkMessage checks a message's metadata and returns its body length.
func checkMessage(b fbuf) (int64, error) {
	root, ok := b.u32(0)
	if !ok {
		return 0, fmt.Errorf("%w: no root", errBadMetadata)
	}
	if err := checkKeyValues(b, root, msgMetadata); err != nil {
		return 0, err
	}
	at, err := b.field(root, msgHeaderType)
	if err != nil {
		return 0, err
	}
	kind, _ := b.u8(at)
	header, err := b.ref(root, msgHeader)
	if err != nil || header == 0 {
		return 0, fmt.Errorf("%w: no header (%v)", errBadMetadata, err)
	}
	switch kind {
	case headerSchema:
		err = checkSchema(b, header)
	case headerRecordBatch:
		err = checkRecordBatch(b, header)
	case headerDictionary:
		var data int64
		if data, err = b.ref(header, dictData); err == nil && data != 0 {
			err = checkRecordBatch(b, data)
		}
	default:
		err = fmt.Errorf("%w: message type %d", errBadMetadata, kind)
	}
	if err != nil {
		return 0, err
	}
	var bodyLen int64
	if at, err = b.field(root, msgBodyLength); err != nil {
		return 0, err
	} else if at != 0 {
		if bodyLen, ok = b.i64(at); !ok || bodyLen < 0 {
			return 0, fmt.Errorf("%w: body length", errBadMetadata)
		}
	}
	return bodyLen, nil
}

func checkSchema(b fbuf, tab int64) error {
	if _, _, err := b.vector(tab, schemaFeatures, 8); err != nil {
		return err
	}
	if err := checkKeyValues(b, tab, schemaMetadata); err != nil {
		return err
	}
	budget := maxFields
	return b.tables(tab, schemaFields, func(f int64) error { return checkField(b, f, 1, &budget) })
}

// checkField checks a field and, depth first, its children; budget counts
// the fields visited.
func checkField(b fbuf, tab int64, depth int, budget *int) error {
	*budget--
	if depth > maxFieldDepth || *budget < 0 {
		return fmt.Errorf("%w: fields nest deeper than %d or number over %d", errBadMetadata, maxFieldDepth, maxFields)
	}
	if err := checkKeyValues(b, tab, fieldMeta); err != nil {
		return err
	}
	at, err := b.field(tab, fieldTypeType)
	if err != nil {
		return err
	}
	if kind, _ := b.u8(at); at != 0 && kind == typeUnion {
		typ, err := b.ref(tab, fieldType)
		if err == nil && typ != 0 {
			_, _, err = b.vector(typ, unionTypeIDs, 4)
		}
		if err != nil {
			return err
		}
	}
	return b.tables(tab, fieldChildren, func(c int64) error { return checkField(b, c, depth+1, budget) })
}

// checkKeyValues checks the custom metadata vector at field i of tab.
func checkKeyValues(b fbuf, tab int64, i int) error {
	_, _, err := b.vector(tab, i, 4)
	return err
}

func checkRecordBatch(b fbuf, tab int64) error {
	if _, _, err := b.vector(tab, rbNodes, 16); err != nil {
		return err
	}
	_, nbuf, err := b.vector(tab, rbBuffers, 16)
	if err != nil {
		return err
	}
	if at, err := b.field(tab, rbCompression); err != nil || at != 0 {
		return fmt.Errorf("%w: compressed record batches are not read (%v)", errBadMetadata, err)
	}
	start, n, err := b.vector(tab, rbVariadic, 8)
	var sum int64
	for k := int64(0); err == nil && k < n; k++ {
		c, _ := b.i64(start + 8*k)
		if sum += c; c < 0 || sum > nbuf {
			err = fmt.Errorf("%w: variadic buffer counts over the %d buffers", errBadMetadata, nbuf)
		}
	}
	return err
}
