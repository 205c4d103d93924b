package proto

import (
	"fmt"

	"github.com/nats-io/nats.go"
)

// HeaderBudget is the room ChunkSize leaves for headers in every message.
// The largest header set this package writes (64-byte job, 10-digit numbers)
// is under 600 bytes; a test guards that.
const HeaderBudget = 1024

// MinChunkSize is the smallest data size per message ChunkSize accepts.
const MinChunkSize = 4096

// ChunkSize returns the data bytes per message for a connection whose
// server allows maxPayload bytes (nc.MaxPayload()), headers included.
func ChunkSize(maxPayload int64) (int, error) {
	n := maxPayload - HeaderBudget
	if n < MinChunkSize {
		return 0, fmt.Errorf("proto: server max_payload %d leaves %d < %d bytes per chunk: %w", maxPayload, n, MinChunkSize, ErrTooLarge)
	}
	return int(min(n, 1<<30)), nil
}

// Chunk splits payload into messages on the key's batch subject, each with
// at most chunkSize data bytes and the full header set. Data slices alias
// payload (no copy); keep payload unchanged until the messages are sent.
func Chunk(key BatchKey, gen int, payload []byte, chunkSize int) ([]*nats.Msg, error) {
	return ChunkSum(key, gen, payload, Checksum(payload), chunkSize)
}

// ChunkSum is Chunk with the payload's CRC-32C computed by the caller (once
// per payload, however often it is sent).
func ChunkSum(key BatchKey, gen int, payload []byte, sum uint32, chunkSize int) ([]*nats.Msg, error) {
	subj, n, err := chunkCount(key, gen, payload, chunkSize)
	if err != nil {
		return nil, err
	}
	h := ChunkHeader{BatchKey: key, Gen: gen, Count: n, Size: int64(len(payload)), Checksum: sum}
	msgs := make([]*nats.Msg, n)
	for i := range n {
		h.Index = i
		msgs[i] = &nats.Msg{Subject: subj, Header: h.Header(), Data: chunkData(payload, i, chunkSize)}
	}
	return msgs, nil
}

// chunkCount checks the arguments of a chunking and returns the key's batch
// subject and the number of chunks.
func chunkCount(key BatchKey, gen int, payload []byte, chunkSize int) (string, int, error) {
	if err := key.Validate(); err != nil {
		return "", 0, err
	}
	subj, _ := key.Subject()
	if chunkSize <= 0 || len(payload) == 0 || gen < 0 {
		return "", 0, fmt.Errorf("proto: chunk %v: chunk size %d, payload %d bytes, gen %d: %w", key, chunkSize, len(payload), gen, ErrInvalidMeta)
	}
	n := (len(payload) + chunkSize - 1) / chunkSize
	if n > 1<<31-1 {
		return "", 0, fmt.Errorf("proto: chunk %v: %d chunks: %w", key, n, ErrTooLarge)
	}
	return subj, n, nil
}

// chunkData returns chunk i of payload: a slice of it, not a copy.
func chunkData(payload []byte, i, chunkSize int) []byte {
	return payload[i*chunkSize : min((i+1)*chunkSize, len(payload))]
}

// Reassemble strictly reassembles the messages of exactly one batch, in any
// order: every chunk once, all headers consistent, size and checksum right.
// It returns the header (Index 0) and the payload.
func Reassemble(msgs []*nats.Msg, maxBatchBytes int64) (ChunkHeader, []byte, error) {
	r, err := NewReassembler[int](ReassemblerConfig{MaxBatchBytes: maxBatchBytes, MaxPending: 1, Strict: true})
	if err != nil {
		return ChunkHeader{}, nil, err
	}
	if len(msgs) == 0 {
		return ChunkHeader{}, nil, fmt.Errorf("proto: reassemble: no messages: %w", ErrChunkMissing)
	}
	var first *ChunkHeader
	for i, m := range msgs {
		h, err := ParseChunkHeader(m.Header)
		if err != nil {
			return ChunkHeader{}, nil, fmt.Errorf("proto: reassemble: message %d: %w", i, err)
		}
		if first == nil {
			first = &h
		} else if h.BatchKey != first.BatchKey || h.Gen != first.Gen {
			return ChunkHeader{}, nil, fmt.Errorf("proto: reassemble: message %d is batch %v, want %v: %w", i, h.BatchKey, first.BatchKey, ErrChunkMismatch)
		}
		a, err := r.Add(m.Header, m.Data, i)
		if err != nil {
			return ChunkHeader{}, nil, err
		}
		if a != nil {
			if i != len(msgs)-1 {
				return ChunkHeader{}, nil, fmt.Errorf("proto: reassemble: %d messages after the batch completed: %w", len(msgs)-1-i, ErrChunkDuplicate)
			}
			return a.Header, a.Payload, nil
		}
	}
	p := r.pending[batchID{first.BatchKey, first.Gen}]
	return ChunkHeader{}, nil, fmt.Errorf("proto: reassemble %v: %d of %d chunks: %w", first.BatchKey, p.n, p.head.Count, ErrChunkMissing)
}
