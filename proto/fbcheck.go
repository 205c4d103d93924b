package proto

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	flatbuffers "github.com/google/flatbuffers/go"
)

// Arrow IPC message header types (Message.fbs, union MessageHeader).
const (
	fbSchema      = 1
	fbRecordBatch = 3
)

const maxFieldDepth = 8

// checkIPCFraming walks an IPC stream before arrow-go parses it: exactly a
// schema message, one record batch message and the end-of-stream marker,
// every message length and body inside the payload, and every flatbuffer
// vector length the arrow reader allocates from bounded by the metadata
// size. arrow-go trusts those lengths (make([]Field, n) with n from the
// wire), so without this a 2 KiB payload can ask for hundreds of gigabytes.
//
// It returns the metadata and body of each of the two messages, slices of b.
func checkIPCFraming(b []byte) (frames [2]ipcFrame, err error) {
	defer func() {
		if p := recover(); p != nil {
			frames, err = [2]ipcFrame{}, fmt.Errorf("proto: ipc framing: malformed flatbuffer (%v): %w", p, ErrSchema)
		}
	}()
	pos, msgs := 0, 0
	for {
		if len(b)-pos < 8 || binary.LittleEndian.Uint32(b[pos:]) != 0xFFFFFFFF {
			return frames, fmt.Errorf("proto: ipc framing: no continuation marker at byte %d: %w", pos, ErrSchema)
		}
		n := int(binary.LittleEndian.Uint32(b[pos+4:]))
		pos += 8
		if n == 0 {
			break
		}
		if n > len(b)-pos || n < 8 {
			return frames, fmt.Errorf("proto: ipc framing: message %d metadata of %d bytes at byte %d: %w", msgs, n, pos, ErrSchema)
		}
		want := byte(fbSchema)
		if msgs == 1 {
			want = fbRecordBatch
		}
		if msgs >= 2 {
			return frames, fmt.Errorf("proto: ipc framing: more than one record batch: %w", ErrSchema)
		}
		body, err := checkMessage(b[pos:pos+n], want)
		if err != nil {
			return frames, fmt.Errorf("proto: ipc framing: message %d: %w", msgs, err)
		}
		frames[msgs].meta = b[pos : pos+n]
		pos += n
		if body < 0 || body > int64(len(b)-pos) {
			return frames, fmt.Errorf("proto: ipc framing: message %d body of %d bytes, %d left: %w", msgs, body, len(b)-pos, ErrSchema)
		}
		frames[msgs].body = b[pos : pos+int(body)]
		pos += int(body)
		msgs++
	}
	if msgs != 2 || pos != len(b) {
		return frames, fmt.Errorf("proto: ipc framing: %d messages, %d trailing bytes (want schema + 1 record batch): %w", msgs, len(b)-pos, ErrSchema)
	}
	return frames, nil
}

// ipcFrame is one IPC message: flatbuffer metadata and body.
type ipcFrame struct{ meta, body []byte }

// frameReader is an ipc.MessageReader over frames already checked by
// checkIPCFraming; its messages alias the payload (no copy).
type frameReader struct {
	frames [2]ipcFrame
	next   int
	// owner, when set, is told (Free) when nothing references the record
	// batch's body any more: the reader and every array decoded from it
	// were released.
	owner memory.Allocator
	msgs  []*ipc.Message // released with the reader, as arrow's own reader does
}

func (r *frameReader) Message() (*ipc.Message, error) {
	if r.next >= len(r.frames) {
		return nil, io.EOF
	}
	f := r.frames[r.next]
	r.next++
	body := memory.NewBufferBytes(f.body)
	if r.owner != nil && r.next == len(r.frames) {
		body = memory.NewBufferWithAllocator(f.body, r.owner)
		defer body.Release() // the message holds it now; arrays decoded from it retain it
	}
	m := ipc.NewMessage(memory.NewBufferBytes(f.meta), body)
	r.msgs = append(r.msgs, m)
	return m, nil
}

func (r *frameReader) Retain() {}

func (r *frameReader) Release() {
	for _, m := range r.msgs {
		m.Release()
	}
	r.msgs = nil
}

// checkMessage checks one Message flatbuffer and returns its body length.
func checkMessage(buf []byte, wantType byte) (int64, error) {
	msg := flatbuffers.Table{Bytes: buf, Pos: flatbuffers.GetUOffsetT(buf)}
	if got := msg.GetUint8Slot(slot(1), 0); got != wantType {
		return 0, fmt.Errorf("header type %d, want %d: %w", got, wantType, ErrSchema)
	}
	o := msg.Offset(slot(2))
	if o == 0 {
		return 0, fmt.Errorf("no header: %w", ErrSchema)
	}
	var hdr flatbuffers.Table
	msg.Union(&hdr, flatbuffers.UOffsetT(o))
	body := msg.GetInt64Slot(slot(3), 0)
	if err := checkVec(msg, 4, 4); err != nil { // custom_metadata
		return 0, err
	}
	if wantType == fbSchema {
		return body, checkSchemaFB(hdr)
	}
	// RecordBatch: nodes and buffers are 16-byte structs, variadic counts int64.
	for _, v := range []struct{ id, size int }{{1, 16}, {2, 16}, {4, 8}} {
		if err := checkVec(hdr, v.id, v.size); err != nil {
			return 0, err
		}
	}
	return body, checkBuffers(hdr, body)
}

// checkBuffers checks the RecordBatch's FieldNodes (length, null count ≥ 0)
// and Buffers (0 ≤ offset, offset+length ≤ body): arrow-go slices the body
// with them and leaks its body buffer when that fails.
func checkBuffers(rb flatbuffers.Table, body int64) error {
	for _, id := range []int{1, 2} {
		o := flatbuffers.UOffsetT(rb.Offset(slot(id)))
		if o == 0 {
			continue
		}
		n, start := rb.VectorLen(o), int(rb.Vector(o))
		for i := range n {
			e := rb.Bytes[start+16*i:]
			a, b := flatbuffers.GetInt64(e), flatbuffers.GetInt64(e[8:])
			if a < 0 || b < 0 || (id == 2 && (a > body || b > body-a)) {
				return fmt.Errorf("record batch %s %d is (%d, %d), body %d bytes: %w", [...]string{1: "node", 2: "buffer"}[id], i, a, b, body, ErrSchema)
			}
		}
	}
	return nil
}

func checkSchemaFB(s flatbuffers.Table) error {
	for _, v := range []struct{ id, size int }{{1, 4}, {2, 4}, {3, 8}} { // fields, custom_metadata, features
		if err := checkVec(s, v.id, v.size); err != nil {
			return err
		}
	}
	return checkFields(s, 1, 0)
}

// checkFields checks the vector of Field tables in slot id of t, recursively
// (Field: children in slot 5, custom_metadata in slot 6).
func checkFields(t flatbuffers.Table, id, depth int) error {
	o := flatbuffers.UOffsetT(t.Offset(slot(id)))
	if o == 0 {
		return nil
	}
	if depth > maxFieldDepth {
		return fmt.Errorf("fields nested deeper than %d: %w", maxFieldDepth, ErrSchema)
	}
	n, start := t.VectorLen(o), t.Vector(o)
	for i := range n {
		f := flatbuffers.Table{Bytes: t.Bytes, Pos: t.Indirect(start + flatbuffers.UOffsetT(4*i))}
		if err := checkVec(f, 6, 4); err != nil {
			return err
		}
		if err := checkVec(f, 5, 4); err != nil {
			return err
		}
		if err := checkFields(f, 5, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// checkVec checks that the vector in slot id of t (if present) fits in the
// buffer with elements of size bytes.
func checkVec(t flatbuffers.Table, id, size int) error {
	o := flatbuffers.UOffsetT(t.Offset(slot(id)))
	if o == 0 {
		return nil
	}
	n, start := t.VectorLen(o), int(t.Vector(o))
	if n < 0 || start > len(t.Bytes) || n > (len(t.Bytes)-start)/size {
		return fmt.Errorf("flatbuffer vector of %d×%d bytes at %d overruns %d-byte metadata: %w", n, size, start, len(t.Bytes), ErrSchema)
	}
	return nil
}

func slot(id int) flatbuffers.VOffsetT { return flatbuffers.VOffsetT(4 + 2*id) }
