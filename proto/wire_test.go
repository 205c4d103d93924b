package proto

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

func TestValidateJob(t *testing.T) {
	for _, tc := range []struct {
		job string
		ok  bool
	}{
		{"clip-run_1", true}, {"A", true}, {strings.Repeat("x", MaxJobLen), true},
		{"", false}, {"a.b", false}, {"a*", false}, {"a>", false}, {"a b", false}, {"a/b", false},
		{"é", false}, {strings.Repeat("x", MaxJobLen+1), false},
	} {
		t.Run(tc.job, func(t *testing.T) {
			err := ValidateJob(tc.job)
			if got := err == nil; got != tc.ok {
				t.Errorf("ValidateJob(%q) = %v, want ok=%v", tc.job, err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidName) {
				t.Errorf("got %v, want ErrInvalidName", err)
			}
		})
	}
}

func TestSubjects(t *testing.T) {
	s, err := BatchSubject("clip", 3, 1)
	if got, want := s, "mmfeed.clip.batch.3.1"; err != nil || got != want {
		t.Fatalf("BatchSubject: got %q, %v, want %q", got, err, want)
	}
	job, dp, mp, err := ParseBatchSubject(s)
	if err != nil || job != "clip" || dp != 3 || mp != 1 {
		t.Errorf("ParseBatchSubject(%q) = %q %d %d %v", s, job, dp, mp, err)
	}
	for _, bad := range []string{"mmfeed.clip.batch.3", "mmfeed.clip.ctl.3.1", "mmfeed.clip.batch.03.1", "mmfeed.clip.batch.-1.1", "x.clip.batch.1.1", "mmfeed.a*b.batch.1.1"} {
		if _, _, _, err := ParseBatchSubject(bad); !errors.Is(err, ErrInvalidName) {
			t.Errorf("ParseBatchSubject(%q) = %v, want ErrInvalidName", bad, err)
		}
	}
	c, err := ControlSubject("clip", CtlRegister)
	if got, want := c, "mmfeed.clip.ctl.register"; err != nil || got != want {
		t.Errorf("ControlSubject: got %q, %v, want %q", got, err, want)
	}
	if _, err := ControlSubject("clip", "a.b"); !errors.Is(err, ErrInvalidName) {
		t.Errorf("ControlSubject(a.b) = %v, want ErrInvalidName", err)
	}
	if got, want := StreamName("clip"), "MMFEED_clip"; got != want {
		t.Errorf("StreamName: got %q, want %q", got, want)
	}
	if got, want := ConsumerName("clip", 2, 1), "mmfeed_clip_2_1"; got != want {
		t.Errorf("ConsumerName: got %q, want %q", got, want)
	}
}

func testHeader() ChunkHeader {
	return ChunkHeader{BatchKey: BatchKey{Job: "clip", Epoch: 1, Step: 42, MicroBatch: 3, DPRank: 2, MPRank: 1},
		Index: 4, Count: 9, Size: 123456, Checksum: 0x0badf00d}
}

func TestChunkHeaderRoundTrip(t *testing.T) {
	for _, gen := range []int{0, 2} {
		h := testHeader()
		h.Gen = gen
		hd := h.Header()
		got, err := ParseChunkHeader(hd)
		if err != nil || got != h {
			t.Errorf("gen %d: got %+v, %v, want %+v", gen, got, err, h)
		}
	}
	h := testHeader()
	hd := h.Header()
	if got, want := hd.Get(HdrMsgID), "clip.1.42.3.2.1.4"; got != want {
		t.Errorf("msg id: got %q, want %q", got, want)
	}
	if got, want := hd.Get(HdrChunk), "4/9"; got != want {
		t.Errorf("chunk: got %q, want %q", got, want)
	}
	if got, want := hd.Get(HdrChecksum), "crc32c:0badf00d"; got != want {
		t.Errorf("checksum: got %q, want %q", got, want)
	}
}

func TestParseChunkHeaderRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(nats.Header)
	}{
		{"missing job", func(h nats.Header) { h.Del(HdrJob) }},
		{"bad job", func(h nats.Header) { h.Set(HdrJob, "a.b") }},
		{"twice", func(h nats.Header) { h.Add(HdrStep, "3") }},
		{"negative", func(h nats.Header) { h.Set(HdrStep, "-1") }},
		{"leading zero", func(h nats.Header) { h.Set(HdrEpoch, "01") }},
		{"index = count", func(h nats.Header) { h.Set(HdrChunk, "9/9") }},
		{"zero count", func(h nats.Header) { h.Set(HdrChunk, "0/0") }},
		{"no slash", func(h nats.Header) { h.Set(HdrChunk, "4") }},
		{"zero size", func(h nats.Header) { h.Set(HdrSize, "0") }},
		{"checksum algo", func(h nats.Header) { h.Set(HdrChecksum, "xxh64:0badf00d") }},
		{"checksum upper", func(h nats.Header) { h.Set(HdrChecksum, "crc32c:0BADF00D") }},
		{"schema", func(h nats.Header) { h.Set(HdrSchema, "2") }},
		{"msg id", func(h nats.Header) { h.Set(HdrMsgID, "clip.1.42.3.2.1.5") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hd := testHeader().Header()
			tc.edit(hd)
			if _, err := ParseChunkHeader(hd); !errors.Is(err, ErrHeader) {
				t.Errorf("got %v, want ErrHeader", err)
			}
		})
	}
}

func TestHeaderBudget(t *testing.T) {
	big := 1<<31 - 1
	h := ChunkHeader{BatchKey: BatchKey{Job: strings.Repeat("j", MaxJobLen), Epoch: big, Step: big, MicroBatch: big, DPRank: big, MPRank: big},
		Gen: big, Index: big - 1, Count: big, Size: 1 << 40, Checksum: 1<<32 - 1}
	n := 0
	for k, vs := range h.Header() {
		for _, v := range vs {
			n += len(k) + len(v) + 4 // "k: v\r\n"
		}
	}
	n += len("NATS/1.0\r\n\r\n")
	if n > HeaderBudget {
		t.Errorf("worst-case header is %d bytes, budget %d", n, HeaderBudget)
	}
}

func randPayload(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestChunkReassemble(t *testing.T) {
	key := testHeader().BatchKey
	payload := randPayload(10000, 1)
	for _, tc := range []struct {
		name      string
		chunkSize int
		edit      func([]*nats.Msg) []*nats.Msg
		wantErr   error
	}{
		{"one chunk", 20000, nil, nil},
		{"exact multiple", 2500, nil, nil},
		{"in order", 3000, nil, nil},
		{"reversed", 3000, func(m []*nats.Msg) []*nats.Msg {
			for i, j := 0, len(m)-1; i < j; i, j = i+1, j-1 {
				m[i], m[j] = m[j], m[i]
			}
			return m
		}, nil},
		{"missing", 3000, func(m []*nats.Msg) []*nats.Msg { return append(m[:1], m[2:]...) }, ErrChunkMissing},
		{"duplicated", 3000, func(m []*nats.Msg) []*nats.Msg { return append([]*nats.Msg{m[1]}, m...) }, ErrChunkDuplicate},
		{"corrupted", 3000, func(m []*nats.Msg) []*nats.Msg {
			d := bytes.Clone(m[2].Data)
			d[7] ^= 0x40
			m[2].Data = d
			return m
		}, ErrChecksum},
		{"truncated", 3000, func(m []*nats.Msg) []*nats.Msg { m[1].Data = m[1].Data[:100]; return m }, ErrChunkMismatch},
		{"other count", 3000, func(m []*nats.Msg) []*nats.Msg { m[1].Header.Set(HdrChunk, "1/5"); m[1].Header.Del(HdrMsgID); return m }, ErrChunkMismatch},
		{"other batch", 3000, func(m []*nats.Msg) []*nats.Msg {
			m[1].Header.Set(HdrStep, "43")
			m[1].Header.Del(HdrMsgID)
			return m
		}, ErrChunkMismatch},
		{"bad header", 3000, func(m []*nats.Msg) []*nats.Msg { m[0].Header.Set(HdrSize, "x"); return m }, ErrHeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs, err := Chunk(key, 0, payload, tc.chunkSize)
			if err != nil {
				t.Fatal(err)
			}
			if want := (len(payload) + tc.chunkSize - 1) / tc.chunkSize; len(msgs) != want {
				t.Fatalf("chunks: got %d, want %d", len(msgs), want)
			}
			if tc.edit != nil {
				msgs = tc.edit(msgs)
			}
			h, got, err := Reassemble(msgs, 1<<20)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil || !bytes.Equal(got, payload) || h.BatchKey != key {
				t.Fatalf("got %d bytes, %v, key %v; want the payload of %v", len(got), err, h.BatchKey, key)
			}
		})
	}
}

func TestReassemblerInterleavedAndRedelivered(t *testing.T) {
	re, err := NewReassembler[int](ReassemblerConfig{MaxBatchBytes: 1 << 20, MaxPending: 2, Remember: 8})
	if err != nil {
		t.Fatal(err)
	}
	k1, k2, k3 := testHeader().BatchKey, testHeader().BatchKey, testHeader().BatchKey
	k2.Step, k3.Step = 43, 44
	p1, p2, p3 := randPayload(5000, 1), randPayload(4000, 2), randPayload(3000, 3)
	m1, _ := Chunk(k1, 0, p1, 2000)
	m2, _ := Chunk(k2, 0, p2, 2000)
	m3, _ := Chunk(k3, 0, p3, 2000)
	type step struct {
		m         *nats.Msg
		wantDone  []byte
		wantDup   bool
		wantEvict BatchKey
	}
	steps := []step{
		{m: m1[0]}, {m: m2[0]}, {m: m1[1]}, {m: m1[1]} /* identical redelivery */, {m: m2[1], wantDone: p2},
		{m: m1[2], wantDone: p1}, {m: m1[0], wantDup: true},
		{m: m3[0]}, {m: m2[0], wantDup: true}, {m: m1[1], wantDup: true},
	}
	for i, s := range steps {
		a, err := re.Add(s.m.Header, s.m.Data, i)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		switch {
		case s.wantDone != nil:
			if a == nil || !bytes.Equal(a.Payload, s.wantDone) || a.Duplicate {
				t.Fatalf("step %d: got %+v, want a completed batch", i, a)
			}
		case s.wantDup:
			if a == nil || !a.Duplicate || len(a.Tags) != 1 || a.Tags[0] != i {
				t.Fatalf("step %d: got %+v, want a duplicate", i, a)
			}
		case a != nil:
			t.Fatalf("step %d: got %+v, want nothing yet", i, a)
		}
	}
	if got, want := re.Pending(), 1; got != want {
		t.Errorf("pending: got %d, want %d", got, want)
	}
	// Two more batches start while k3 is incomplete: k3 is evicted.
	k4, k5 := k3, k3
	k4.Step, k5.Step = 45, 46
	m4, _ := Chunk(k4, 0, p1, 2000)
	m5, _ := Chunk(k5, 0, p3, 2000)
	for _, m := range []*nats.Msg{m4[0], m5[0]} {
		if _, err := re.Add(m.Header, m.Data, 0); err != nil {
			t.Fatal(err)
		}
	}
	ev := re.Evicted()
	if len(ev) != 1 || ev[0].Header.BatchKey != k3 || !errors.Is(ev[0].Err, ErrChunkMissing) {
		t.Fatalf("evicted: got %+v, want k3 with ErrChunkMissing", ev)
	}
	if got, want := re.Held(), 2; got != want {
		t.Errorf("held: got %d, want %d", got, want)
	}
	// A redelivery with different bytes is a conflict.
	bad := *m4[1]
	bad.Data = bytes.Clone(bad.Data)
	if _, err := re.Add(bad.Header, bad.Data, 0); err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(bad.Data)
	flipped[0] ^= 1
	if _, err := re.Add(bad.Header, flipped, 0); !errors.Is(err, ErrChunkDuplicate) {
		t.Errorf("conflicting redelivery: got %v, want ErrChunkDuplicate", err)
	}
}

func FuzzReassemble(f *testing.F) {
	key := testHeader().BatchKey
	for _, n := range []int{1, 100, 3000} {
		msgs, _ := Chunk(key, 0, randPayload(n, uint64(n)), 1024)
		var enc []byte
		for _, m := range msgs {
			enc = append(enc, encodeMsg(m)...)
		}
		f.Add(enc)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs := decodeMsgs(b)
		h, payload, err := Reassemble(msgs, 1<<20)
		if err != nil {
			return
		}
		if int64(len(payload)) != h.Size || Checksum(payload) != h.Checksum {
			t.Fatalf("accepted a payload of %d bytes, crc %08x; header says %d, %08x", len(payload), Checksum(payload), h.Size, h.Checksum)
		}
		re, _ := NewReassembler[int](DefaultReassemblerConfig())
		for i, m := range msgs {
			_, _ = re.Add(m.Header, m.Data, i)
		}
	})
}

// encodeMsg serialises a message for the fuzz corpus: header lines
// "k: v\n", a blank line, the data length as 2 bytes, the data.
func encodeMsg(m *nats.Msg) []byte {
	var b []byte
	for k, vs := range m.Header {
		for _, v := range vs {
			b = append(b, k+": "+v+"\n"...)
		}
	}
	b = append(b, '\n', byte(len(m.Data)>>8), byte(len(m.Data)))
	return append(b, m.Data...)
}

func decodeMsgs(b []byte) []*nats.Msg {
	var out []*nats.Msg
	for len(b) > 0 && len(out) < 64 {
		end := bytes.Index(b, []byte("\n\n"))
		if end < 0 || len(b) < end+4 {
			break
		}
		m := &nats.Msg{Header: nats.Header{}}
		for _, line := range strings.Split(string(b[:end]), "\n") {
			if k, v, ok := strings.Cut(line, ": "); ok {
				m.Header.Add(k, v)
			}
		}
		n := int(b[end+2])<<8 | int(b[end+3])
		b = b[end+4:]
		n = min(n, len(b))
		m.Data, b = b[:n], b[n:]
		out = append(out, m)
	}
	return out
}

func FuzzParseChunkHeader(f *testing.F) {
	f.Add("clip", "1", "42", "3", "2", "1", "4/9", "123456", "crc32c:0badf00d", "1")
	f.Add("x", "0", "0", "0", "0", "0", "0/1", "1", "crc32c:00000000", "1")
	f.Fuzz(func(t *testing.T, job, epoch, step, mb, dp, mp, chunk, size, sum, schema string) {
		hd := nats.Header{}
		for k, v := range map[string]string{HdrJob: job, HdrEpoch: epoch, HdrStep: step, HdrMicroBatch: mb, HdrDPRank: dp,
			HdrMPRank: mp, HdrChunk: chunk, HdrSize: size, HdrChecksum: sum, HdrSchema: schema} {
			hd.Set(k, v)
		}
		h, err := ParseChunkHeader(hd)
		if err != nil {
			return
		}
		again, err := ParseChunkHeader(h.Header())
		if err != nil || again != h {
			t.Fatalf("re-encoding %+v: got %+v, %v", h, again, err)
		}
	})
}
