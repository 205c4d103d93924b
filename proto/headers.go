package proto

import (
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
)

// Header names of a batch chunk message. Values are ASCII; integers are
// canonical decimal (no sign, no leading zeros).
const (
	HdrJob        = "Mmfeed-Job"
	HdrEpoch      = "Mmfeed-Epoch"
	HdrStep       = "Mmfeed-Step"
	HdrMicroBatch = "Mmfeed-Micro-Batch"
	HdrDPRank     = "Mmfeed-Dp-Rank"
	HdrMPRank     = "Mmfeed-Mp-Rank"
	// HdrChunk is "i/n": 0-based chunk index i of n chunks.
	HdrChunk = "Mmfeed-Chunk"
	// HdrSize is the byte length of the whole (reassembled) payload.
	HdrSize = "Mmfeed-Size"
	// HdrChecksum is "crc32c:" + 8 lowercase hex digits: CRC-32C
	// (Castagnoli) of the whole payload, the same on every chunk.
	HdrChecksum = "Mmfeed-Checksum"
	// HdrSchema is the schema version, SchemaVersion.
	HdrSchema = "Mmfeed-Schema"
	// HdrGeneration is the replay generation, present only when > 0.
	HdrGeneration = "Mmfeed-Generation"
	// HdrMsgID is JetStream's dedupe id.
	HdrMsgID = "Nats-Msg-Id"
)

// checksumPrefix names the checksum algorithm inside HdrChecksum.
const checksumPrefix = "crc32c:"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC-32C (Castagnoli) of b, the HdrChecksum value.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// BatchKey identifies one micro-batch of one rank.
type BatchKey struct {
	Job                     string
	Epoch, Step, MicroBatch int
	DPRank, MPRank          int
}

// Key returns the BatchKey of m.
func (m BatchMeta) Key() BatchKey {
	return BatchKey{Job: m.Job, Epoch: m.Epoch, Step: m.Step, MicroBatch: m.MicroBatch, DPRank: m.DPRank, MPRank: m.MPRank}
}

// String returns job/e<epoch>/s<step>/mb<mb>/dp<dp>/mp<mp>, for messages.
func (k BatchKey) String() string {
	return fmt.Sprintf("%s/e%d/s%d/mb%d/dp%d/mp%d", k.Job, k.Epoch, k.Step, k.MicroBatch, k.DPRank, k.MPRank)
}

// Subject returns the batch subject of the key's rank.
func (k BatchKey) Subject() (string, error) { return BatchSubject(k.Job, k.DPRank, k.MPRank) }

// Validate checks the job name and that every number is in [0, 2^31).
func (k BatchKey) Validate() error {
	if err := ValidateJob(k.Job); err != nil {
		return err
	}
	for _, v := range []int{k.Epoch, k.Step, k.MicroBatch, k.DPRank, k.MPRank} {
		if v < 0 || v > 1<<31-1 {
			return fmt.Errorf("proto: batch key %v: number out of range: %w", k, ErrInvalidMeta)
		}
	}
	return nil
}

// MsgID returns <job>.<epoch>.<step>.<mb>.<dp>.<mp>.<chunk>, with ".g<gen>"
// appended when gen > 0, so that a deliberate replay is not dropped by the
// stream's duplicate window while retries of one publish are.
func (k BatchKey) MsgID(chunk, gen int) string {
	b := make([]byte, 0, len(k.Job)+48)
	b = append(b, k.Job...)
	for _, v := range []int{k.Epoch, k.Step, k.MicroBatch, k.DPRank, k.MPRank, chunk} {
		b = append(b, '.')
		b = strconv.AppendInt(b, int64(v), 10)
	}
	if gen > 0 {
		b = append(b, ".g"...)
		b = strconv.AppendInt(b, int64(gen), 10)
	}
	return string(b)
}

// ChunkHeader is the parsed header of one chunk message.
type ChunkHeader struct {
	BatchKey
	// Gen is the replay generation (0 for the first publish).
	Gen int
	// Index and Count: this is chunk Index of Count (0 ≤ Index < Count).
	Index, Count int
	// Size is the byte length of the whole payload.
	Size int64
	// Checksum is the CRC-32C of the whole payload.
	Checksum uint32
}

// Header encodes h as NATS message headers, including Nats-Msg-Id.
func (h ChunkHeader) Header() nats.Header {
	hd := make(nats.Header, 12)
	hd.Set(HdrJob, h.Job)
	hd.Set(HdrEpoch, strconv.Itoa(h.Epoch))
	hd.Set(HdrStep, strconv.Itoa(h.Step))
	hd.Set(HdrMicroBatch, strconv.Itoa(h.MicroBatch))
	hd.Set(HdrDPRank, strconv.Itoa(h.DPRank))
	hd.Set(HdrMPRank, strconv.Itoa(h.MPRank))
	hd.Set(HdrChunk, strconv.Itoa(h.Index)+"/"+strconv.Itoa(h.Count))
	hd.Set(HdrSize, strconv.FormatInt(h.Size, 10))
	hd.Set(HdrChecksum, fmt.Sprintf("%s%08x", checksumPrefix, h.Checksum))
	hd.Set(HdrSchema, SchemaVersion)
	if h.Gen > 0 {
		hd.Set(HdrGeneration, strconv.Itoa(h.Gen))
	}
	hd.Set(HdrMsgID, h.MsgID(h.Index, h.Gen))
	return hd
}

// ParseChunkHeader parses and checks the mmfeed headers of a chunk message:
// every required header present exactly once and well-formed, schema version
// known, 0 ≤ index < count, size > 0, and Nats-Msg-Id (when present) equal to
// the id the other headers imply. Errors wrap ErrHeader.
func ParseChunkHeader(hd nats.Header) (ChunkHeader, error) {
	var h ChunkHeader
	p := headerParser{hd: hd}
	h.Job = p.str(HdrJob)
	if p.err == nil {
		if err := ValidateJob(h.Job); err != nil {
			p.fail(HdrJob, h.Job)
		}
	}
	h.Epoch, h.Step, h.MicroBatch = p.num(HdrEpoch), p.num(HdrStep), p.num(HdrMicroBatch)
	h.DPRank, h.MPRank = p.num(HdrDPRank), p.num(HdrMPRank)
	if s := p.str(HdrSchema); p.err == nil && s != SchemaVersion {
		p.fail(HdrSchema, s)
	}
	h.Index, h.Count = p.chunk()
	size := p.str(HdrSize)
	if v, err := parseNonNeg64(size); p.err == nil && (err != nil || v == 0) {
		p.fail(HdrSize, size)
	} else {
		h.Size = v
	}
	h.Checksum = p.checksum()
	if _, ok := hd[HdrGeneration]; ok {
		h.Gen = p.num(HdrGeneration)
	}
	if p.err != nil {
		return ChunkHeader{}, p.err
	}
	if id, ok := hd[HdrMsgID]; ok && (len(id) != 1 || id[0] != h.MsgID(h.Index, h.Gen)) {
		return ChunkHeader{}, fmt.Errorf("proto: header %s=%q, want %q: %w", HdrMsgID, id, h.MsgID(h.Index, h.Gen), ErrHeader)
	}
	return h, nil
}

type headerParser struct {
	hd  nats.Header
	err error
}

func (p *headerParser) fail(name, val string) {
	if p.err == nil {
		p.err = fmt.Errorf("proto: header %s=%q malformed: %w", name, val, ErrHeader)
	}
}

func (p *headerParser) str(name string) string {
	v := p.hd[name]
	if p.err == nil && len(v) != 1 {
		p.err = fmt.Errorf("proto: header %s present %d times, want once: %w", name, len(v), ErrHeader)
	}
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func (p *headerParser) num(name string) int {
	s := p.str(name)
	v, err := parseNonNeg(s)
	if err != nil {
		p.fail(name, s)
	}
	return v
}

func (p *headerParser) chunk() (int, int) {
	s := p.str(HdrChunk)
	is, ns, ok := strings.Cut(s, "/")
	i, err1 := parseNonNeg(is)
	n, err2 := parseNonNeg(ns)
	if !ok || err1 != nil || err2 != nil || n == 0 || i >= n {
		p.fail(HdrChunk, s)
		return 0, 0
	}
	return i, n
}

func (p *headerParser) checksum() uint32 {
	s := p.str(HdrChecksum)
	hex, ok := strings.CutPrefix(s, checksumPrefix)
	if !ok || len(hex) != 8 || strings.ToLower(hex) != hex {
		p.fail(HdrChecksum, s)
		return 0
	}
	v, err := strconv.ParseUint(hex, 16, 32)
	if err != nil {
		p.fail(HdrChecksum, s)
	}
	return uint32(v)
}

func parseNonNeg64(s string) (int64, error) {
	if s == "" || len(s) > 18 || (len(s) > 1 && s[0] == '0') {
		return 0, ErrHeader
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, ErrHeader
	}
	return v, nil
}
