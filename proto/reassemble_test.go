package proto

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/nats-io/nats.go"
)

// Chunks land in one buffer as they arrive, in any order; what breaks
// section 4 fails the batch with a reason that names the chunk.
func TestReassemblerChunkFaults(t *testing.T) {
	key := testHeader().BatchKey
	payload := randPayload(10_000, 7) // chunks of 3000: 3000, 3000, 3000, 1000
	clone := func(m *nats.Msg, data []byte) *nats.Msg {
		return &nats.Msg{Header: m.Header, Data: data}
	}
	for _, tc := range []struct {
		name    string
		edit    func(m []*nats.Msg) []*nats.Msg
		wantErr error
		wantMsg string // in the error
	}{
		{"in order", nil, nil, ""},
		{"reversed", func(m []*nats.Msg) []*nats.Msg { slices.Reverse(m); return m }, nil, ""},
		{"last first, then interleaved", func(m []*nats.Msg) []*nats.Msg { return []*nats.Msg{m[3], m[1], m[0], m[2]} }, nil, ""},
		{"identical repeats absorbed", func(m []*nats.Msg) []*nats.Msg { return []*nats.Msg{m[1], m[1], m[0], m[3], m[0], m[2]} }, nil, ""},
		{"repeat with other bytes", func(m []*nats.Msg) []*nats.Msg {
			d := bytes.Clone(m[1].Data)
			d[10] ^= 1
			return []*nats.Msg{m[1], clone(m[1], d), m[0], m[2], m[3]}
		}, ErrChunkDuplicate, "arrived twice"},
		{"truncated middle chunk", func(m []*nats.Msg) []*nats.Msg { m[1] = clone(m[1], m[1].Data[:2999]); return m }, ErrChunkMismatch, "truncated"},
		{"truncated last chunk", func(m []*nats.Msg) []*nats.Msg { m[3] = clone(m[3], m[3].Data[:999]); return m }, ErrChunkMismatch, "truncated"},
		{"truncated last chunk first", func(m []*nats.Msg) []*nats.Msg {
			return []*nats.Msg{clone(m[3], m[3].Data[:10]), m[0], m[1], m[2]}
		}, ErrChunkMismatch, "truncated or mis-sized"},
		{"long last chunk first", func(m []*nats.Msg) []*nats.Msg {
			return []*nats.Msg{clone(m[3], make([]byte, 3001)), m[0], m[1], m[2]}
		}, ErrChunkMismatch, "do not cut"},
		{"long last chunk", func(m []*nats.Msg) []*nats.Msg {
			m[3] = clone(m[3], append(bytes.Clone(m[3].Data), 1))
			return m
		}, ErrChunkMismatch, "want 1000"},
		{"checksum mismatch", func(m []*nats.Msg) []*nats.Msg {
			d := bytes.Clone(m[2].Data)
			d[0] ^= 0x80
			m[2] = clone(m[2], d)
			return m
		}, ErrChecksum, "crc32c"},
		{"checksum mismatch out of order", func(m []*nats.Msg) []*nats.Msg {
			d := bytes.Clone(m[0].Data)
			d[5] ^= 0x80
			return []*nats.Msg{m[3], m[2], m[1], clone(m[0], d)}
		}, ErrChecksum, "crc32c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs, err := Chunk(key, 0, payload, 3000)
			if err != nil || len(msgs) != 4 {
				t.Fatalf("Chunk: %d messages, %v", len(msgs), err)
			}
			if tc.edit != nil {
				msgs = tc.edit(msgs)
			}
			r, err := NewReassembler[int](DefaultReassemblerConfig())
			if err != nil {
				t.Fatal(err)
			}
			var got *Assembled[int]
			for i, m := range msgs {
				a, err := r.Add(m.Header, bytes.Clone(m.Data), i) // as received: a buffer of its own
				if err != nil {
					if tc.wantErr == nil || !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantMsg) {
						t.Fatalf("chunk %d: got %v, want %v containing %q", i, err, tc.wantErr, tc.wantMsg)
					}
					if a == nil || len(a.Tags) == 0 || a.Payload != nil {
						t.Fatalf("a failed batch gives back its tags and no payload: got %+v", a)
					}
					return
				}
				if a != nil {
					got = a
				}
			}
			if tc.wantErr != nil {
				t.Fatalf("no error, want %v", tc.wantErr)
			}
			if got == nil || !bytes.Equal(got.Payload, payload) || len(got.Tags) != len(msgs) {
				t.Fatalf("got %+v, want the payload with %d tags", got, len(msgs))
			}
		})
	}
}

// A batch missing a chunk stays pending and fails with ErrChunkMissing on
// Expire; the chunk data it held was copied, so the caller's buffers may be
// reused at once.
func TestReassemblerMissingChunkAndCopiedData(t *testing.T) {
	key := testHeader().BatchKey
	payload := randPayload(7000, 3)
	msgs, _ := Chunk(key, 0, payload, 3000)
	r, _ := NewReassembler[int](DefaultReassemblerConfig())
	scratch := make([]byte, 3000)
	for _, i := range []int{2, 0} {
		n := copy(scratch, msgs[i].Data)
		if a, err := r.Add(msgs[i].Header, scratch[:n], i); a != nil || err != nil {
			t.Fatalf("chunk %d: got %+v, %v; want pending", i, a, err)
		}
		clear(scratch) // the caller reuses its buffer
	}
	n := copy(scratch, msgs[1].Data)
	a, err := r.Add(msgs[1].Header, scratch[:n], 1)
	if err != nil || a == nil || !bytes.Equal(a.Payload, payload) {
		t.Fatalf("got %v, %v; want the payload", a, err)
	}
	if _, err := r.Add(msgs[0].Header, msgs[0].Data, 3); err != nil {
		t.Fatal(err)
	}
	other := key
	other.Step++
	m2, _ := Chunk(other, 0, payload, 3000)
	if a, err := r.Add(m2[0].Header, m2[0].Data, 4); a != nil || err != nil {
		t.Fatalf("got %+v, %v; want pending", a, err)
	}
	exp := r.Expire(time.Now().Add(time.Hour), time.Minute)
	if len(exp) != 1 || !errors.Is(exp[0].Err, ErrChunkMissing) || exp[0].Header.BatchKey != other || !strings.Contains(exp[0].Err.Error(), "1 of 3 chunks") {
		t.Fatalf("expired %+v, want %v missing 2 of 3 chunks", exp, other)
	}
}

// A header that claims more chunks than the payload has bytes fails before
// anything is allocated for it.
func TestReassemblerRejectsImpossibleCount(t *testing.T) {
	h := testHeader()
	h.Index, h.Count, h.Size = 0, 1<<31-1, 100
	r, _ := NewReassembler[int](DefaultReassemblerConfig())
	a, err := r.Add(h.Header(), make([]byte, 10), 0)
	if !errors.Is(err, ErrChunkMismatch) || a == nil || r.Pending() != 0 {
		t.Fatalf("got %+v, %v, %d pending; want ErrChunkMismatch and nothing pending", a, err, r.Pending())
	}
}

// SendBatch writes the headers Chunk writes (one header set, mutated per
// chunk, must not leak one chunk's index into another's message).
func TestSendBatchMatchesChunk(t *testing.T) {
	s := startServer(t, 64<<10)
	nc, _ := connect(t, s)
	key := testHeader().BatchKey
	payload := randPayload(150_000, 5)
	inbox := nc.NewInbox()
	ch := make(chan *nats.Msg, 16)
	if _, err := nc.ChanSubscribe(inbox, ch); err != nil {
		t.Fatal(err)
	}
	want, _ := ChunkSum(key, 2, payload, Checksum(payload), 60_000)
	n, err := SendBatch(nc, inbox, key, 2, payload, Checksum(payload), 60_000)
	if err != nil || n != 3 || len(want) != 3 {
		t.Fatalf("sent %d, %v; want 3 chunks", n, err)
	}
	for i := range n {
		select {
		case m := <-ch:
			for k, v := range want[i].Header {
				if !slices.Equal(m.Header[k], v) {
					t.Errorf("chunk %d header %s: got %q, want %q", i, k, m.Header[k], v)
				}
			}
			if !bytes.Equal(m.Data, want[i].Data) {
				t.Errorf("chunk %d: data differs", i)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("chunk %d not received", i)
		}
	}
}

// The buffer a record was decoded from is given back exactly once, when
// the last reference to the record is released, never earlier.
func TestDecodeIPCReleasesPayloadOnce(t *testing.T) {
	m := testMeta(ModalityAll, DTypeFloat16, []int{3, 8, 8})
	payload := mustEncode(t, m, testRows(m, 4))
	released := 0
	rec, err := decodeIPC(memory.NewGoAllocator(), payload, func() { released++ })
	if err != nil {
		t.Fatal(err)
	}
	rec.Retain() // a second holder, as a trainer keeping the record past Batch.Release
	rec.Release()
	if released != 0 {
		t.Fatalf("released %d times while the record is held", released)
	}
	rec.Release()
	if released != 1 {
		t.Fatalf("released %d times after the last release, want 1", released)
	}
	bad := bytes.Clone(payload)
	bad = bad[:len(bad)-64] // a body shorter than its record batch says
	calls := 0
	if _, err := decodeIPC(memory.NewGoAllocator(), bad, func() { calls++ }); err == nil || calls > 1 {
		t.Fatalf("truncated payload: %v, released %d times; want an error, at most one release", err, calls)
	}
}

func TestBufPoolReusesSimilarSizes(t *testing.T) {
	p := newBufPool(2)
	a := p.get(1000)
	p.put(a)
	if b := p.get(900); len(b) != 900 || &b[0] != &a[0] {
		t.Fatalf("a 1000-byte buffer was not reused for 900 bytes")
	}
	p.put(a)
	if b := p.get(400); &b[0] == &a[0] {
		t.Fatalf("a 1000-byte buffer was reused for 400 bytes (over twice the size)")
	}
	if b := p.get(2000); len(b) != 2000 || &b[0] == &a[0] {
		t.Fatalf("a 1000-byte buffer was reused for 2000 bytes")
	}
	for range 3 {
		p.put(make([]byte, 10))
	}
	if len(p.free) != 2 {
		t.Fatalf("%d buffers kept, want at most 2", len(p.free))
	}
}

// ReadRows copies everything, sample ids included: what it returns
// survives the record's memory being reused.
func TestReadRowsCopiesIDs(t *testing.T) {
	m := testMeta(ModalityAll, DTypeFloat16, []int{3, 8, 8})
	payload := mustEncode(t, m, testRows(m, 4))
	rec, err := DecodeIPC(memory.NewGoAllocator(), payload)
	if err != nil {
		t.Fatal(err)
	}
	_, rows, err := ReadRows(rec)
	rec.Release()
	if err != nil {
		t.Fatal(err)
	}
	clear(payload) // as the Fetcher's next batch overwrites a released buffer
	if rows[3].ID != "sample-003" || len(rows[3].Pixels) == 0 || rows[3].Pixels[0] == 0 && rows[3].Pixels[1] == 0 && rows[3].Pixels[2] == 0 {
		t.Fatalf("row 3 after the buffer was cleared: id %q, pixels %v", rows[3].ID, rows[3].Pixels[:4])
	}
}
