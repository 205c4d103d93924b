// Package proto is mmfeed's wire: the Arrow schema of a micro-batch, building
// and reading those records, their IPC encoding, the NATS subjects and
// headers that carry them, chunking and reassembly of payloads larger than a
// server's max_payload, the JSON control messages, the core data plane
// (fetch and ack messages, SendBatch, the Go Fetcher) and the JetStream data
// plane (stream, per-rank durable consumers, KV bucket) with a Go Publisher
// and Consumer. docs/protocol.md is the normative description for clients in
// other languages; this package is its reference implementation.
//
// Inputs and outputs:
//   - BuildRecord turns a BatchMeta and []Row into one arrow.RecordBatch whose
//     schema is Schema(meta); EncodeIPC/DecodeIPC convert it to and from one
//     self-contained Arrow IPC stream (schema + one record batch + EOS).
//     The same record is written to shard files and to the wire. BatchMeta.Keep
//     adds nullable kept columns (keep.NAME: utf8, int64 or float64) after the
//     modality's; Row.Keep holds their values (keep.go). Without Keep a record
//     is exactly the version-1 record it always was.
//   - Chunk splits an IPC payload into ≤ max-payload NATS messages with
//     headers; Reassembler (streaming) and Reassemble (all at once) verify
//     index, count, size and the CRC-32C checksum and give the payload back.
//   - Core data plane (the default): a rank asks for each batch with a
//     FetchRequest on its FetchSubject; the service answers with SendBatch
//     (chunks on core NATS to the request's inbox); the rank acknowledges
//     applied batches with an AckRequest. Fetcher is the Go client: it asks a
//     window of batches ahead (the consumer's flow control), asks again for
//     a batch lost or corrupted on the way (at once after a reconnect), and
//     returns batches in plan order.
//   - RegisterRank sends a rank's Register and returns the service's reply;
//     it sends the register again when it or its reply is lost (a reconnect,
//     no service subscribed yet, an unanswered attempt).
//   - JetStream data plane: Publisher publishes the chunks of a batch to
//     JetStream with Nats-Msg-Id dedupe and retries on stream-full rejections
//     (backpressure) until its context ends; Consumer.Next returns whole
//     verified batches of one rank.
//
// Ownership: every arrow.RecordBatch returned by this package is owned by the
// caller, who must Release it (Batch.Release for a Consumer batch). Row slices
// passed to BuildRecord are copied and may be reused after it returns.
// DecodeIPC is zero-copy: the record aliases the payload, which must not
// change while the record lives. Payloads returned by Reassemble and
// Reassembler are fresh slices owned by the caller.
//
// Concurrency: the pure functions (BuildRecord, EncodeIPC, DecodeIPC, Chunk,
// Reassemble, SendBatch, subject and header helpers, validation) are safe for
// concurrent use. A Publisher is safe for concurrent use; a Reassembler, a
// Consumer and a Fetcher's Next are not (one goroutine per rank); Batch.Ack
// may run on another goroutine.
package proto
