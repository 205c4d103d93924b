package proto

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
)

// Data planes a service can run (RegisterReply.DataPlane).
const (
	// DataPlaneCore: payloads travel on core NATS, in memory, each batch
	// sent when the rank asks for it (FetchRequest) and dropped when the rank
	// acknowledges it (AckRequest). A lost payload is asked for again and,
	// when the service no longer holds it, regenerated from the plan.
	DataPlaneCore = "core"
	// DataPlaneJetStream: payloads are stored in the job's JetStream stream
	// and read through a durable pull consumer per rank.
	DataPlaneJetStream = "jetstream"
)

// FetchSubject returns mmfeed.<job>.fetch.<dp>.<mp>: where rank (dp, mp)
// asks for its next batches on the core data plane.
func FetchSubject(job string, dp, mp int) (string, error) { return rankSubject(job, "fetch", dp, mp) }

// AckSubject returns mmfeed.<job>.ack.<dp>.<mp>: where rank (dp, mp)
// acknowledges the batches it applied on the core data plane.
func AckSubject(job string, dp, mp int) (string, error) { return rankSubject(job, "ack", dp, mp) }

// AckWildcard returns mmfeed.<job>.ack.*.*, every rank's ack subject.
func AckWildcard(job string) (string, error) {
	if err := ValidateJob(job); err != nil {
		return "", err
	}
	return SubjectPrefix + "." + job + ".ack.*.*", nil
}

func rankSubject(job, kind string, dp, mp int) (string, error) {
	if err := ValidateJob(job); err != nil {
		return "", err
	}
	if dp < 0 || mp < 0 {
		return "", fmt.Errorf("proto: rank dp=%d mp=%d negative: %w", dp, mp, ErrInvalidName)
	}
	return SubjectPrefix + "." + job + "." + kind + "." + strconv.Itoa(dp) + "." + strconv.Itoa(mp), nil
}

// FetchRequest asks for one batch of a rank on the core data plane
// (published on FetchSubject with a reply inbox). The service answers by
// publishing the batch's chunks to the reply subject once the batch is
// built; a request it cannot serve (outside the plan) gets no answer.
// Asking again for the same key is safe: the receiver drops copies of a
// batch it already has (Reassembler).
type FetchRequest struct {
	Job        string `json:"job"`
	Epoch      int    `json:"epoch"`
	Step       int    `json:"step"`
	MicroBatch int    `json:"micro_batch"`
	DPRank     int    `json:"dp_rank"`
	MPRank     int    `json:"mp_rank"`
	// View asks for a copy for a viewer (`mmfeed inspect`, ViewBatch): the
	// service answers from what it holds or builds the batch for this reply
	// only, without moving the rank, marking the batch sent or waiting for
	// an ack; a batch it cannot give gets a ViewErrorHeader reply.
	View bool `json:"view,omitempty"`
}

// Key returns the batch the request names.
func (f FetchRequest) Key() BatchKey {
	return BatchKey{Job: f.Job, Epoch: f.Epoch, Step: f.Step, MicroBatch: f.MicroBatch, DPRank: f.DPRank, MPRank: f.MPRank}
}

// Validate checks the key.
func (f FetchRequest) Validate() error {
	if err := f.Key().Validate(); err != nil {
		return fmt.Errorf("proto: fetch: %w: %w", err, ErrControl)
	}
	return nil
}

// AckRequest tells the service (on AckSubject) that the rank applied every
// one of its batches up to and including this key; the service drops them
// and records the rank's position. With a reply subject the service answers
// an empty message once it has dropped them.
type AckRequest FetchRequest // View is ignored

// Key returns the last applied batch.
func (a AckRequest) Key() BatchKey { return FetchRequest(a).Key() }

// Validate checks the key.
func (a AckRequest) Validate() error { return FetchRequest(a).Validate() }

// NewFetchRequest returns the request for key.
func NewFetchRequest(k BatchKey) FetchRequest {
	return FetchRequest{Job: k.Job, Epoch: k.Epoch, Step: k.Step, MicroBatch: k.MicroBatch, DPRank: k.DPRank, MPRank: k.MPRank}
}

// SendBatch publishes payload (whose CRC-32C is sum) as chunk messages of at
// most chunkSize data bytes to subj (a fetch's reply inbox) on core NATS.
// Each chunk's data is a slice of payload (nats.go copies it once, into the
// connection's write buffer), and the header set is built once per batch:
// only the chunk index and message id change from chunk to chunk. It
// returns the number of chunks sent.
func SendBatch(nc *nats.Conn, subj string, key BatchKey, gen int, payload []byte, sum uint32, chunkSize int) (int, error) {
	_, n, err := chunkCount(key, gen, payload, chunkSize)
	if err != nil {
		return 0, err
	}
	h := ChunkHeader{BatchKey: key, Gen: gen, Count: n, Size: int64(len(payload)), Checksum: sum}
	hd := h.Header()
	count := "/" + strconv.Itoa(n)
	for i := range n {
		if i > 0 { // PublishMsg encodes the headers before it returns
			hd[HdrChunk] = []string{strconv.Itoa(i) + count}
			hd[HdrMsgID] = []string{key.MsgID(i, gen)}
		}
		m := nats.Msg{Subject: subj, Header: hd, Data: chunkData(payload, i, chunkSize)}
		if err := nc.PublishMsg(&m); err != nil {
			return i, fmt.Errorf("proto: send %v chunk %d: %w", key, i, err)
		}
	}
	return n, nil
}
