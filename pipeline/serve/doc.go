// Package serve is `mmfeed serve`: it plans each epoch of a dataset
// (pipeline, balancer), preprocesses the planned samples on all cores, and
// publishes every (epoch, step, micro-batch, dp rank, mp rank) batch as Arrow
// IPC chunks on NATS JetStream (proto), one durable consumer per trainer
// rank, following docs/protocol.md. It answers the trainers' control
// messages, keeps its state in the job's KV bucket so that a restart of the
// service or of any trainer rank loses and repeats nothing, refits the cost
// model from the trainers' measured step times, and serves the live balance
// report over HTTP.
//
// # Inputs and outputs
//
// A Config: the pipeline configuration (dataset, tokenizer, image policy,
// plan with dp, micro-batches, global batch, placement, seed, first epoch),
// the job name, mp, the number of epochs, the NATS deployment (the embedded
// server by default, or external URLs with user/password, token, NKey or
// credentials and TLS), stream bounds and the HTTP address. Outputs are the
// stream's batches, the KV state, quarantine-e<epoch>.jsonl files, the HTTP
// endpoints (/v1/report, /metrics, /healthz, /) and Stats.
//
// # Delivery
//
//   - Each mp rank gets its modality's columns only (proto.ModalityFor): with
//     placement modality the vision rank gets pixels, the text rank tokens,
//     the same ids in the same order.
//   - The stream is bounded (StreamMaxBytes, discard new): when trainers are
//     slow or absent the publisher waits (backpressure) and preprocessing,
//     which runs at most two steps ahead, waits with it. Memory stays bounded.
//   - A rank's batches are published in plan order; its cursor is the next
//     step to publish to it.
//
// # Resume
//
// The KV bucket mmfeed_<job> holds the job record (config: layout and a
// fingerprint of dataset, plan, tokenizer and image settings; a mismatching
// service refuses to start), each epoch's info (epoch.<e>: steps, plan
// hash, the cost-model segments), the current epoch, each rank's last
// completed step (rank.<dp>.<mp>.step, from feedback and done), each rank's
// generation (rank.<dp>.<mp>.gen) and finished. On restart the service
// replans every epoch identically (replaying recorded recalibrations), sets
// each rank's cursor after the last batch the stream still holds for it (or
// after its last completed step) and publishes from the minimum; chunks
// still stored are dropped by the stream's Nats-Msg-Id dedupe or by the
// receivers' batch-key dedupe.
//
// On register, a rank whose consumer still has chunks delivered to an earlier
// incarnation gets a fresh consumer (everything still stored is delivered
// again at once, in order); a rank that needs a step the stream no longer
// holds (its checkpoint is older than its acknowledgements) is rewound: its
// subject is purged, its generation incremented and recorded, and it is
// republished from that step. A resend request rewinds the rank to the
// failed batch's step the same way.
//
// # Calibration
//
// Feedback from every mp rank of a dp rank for a step makes one observation:
// the plan's feature sum of the rank's samples and the slowest mp rank's
// compute seconds. With Recalibrate ≥ 0 the next epoch is planned with the
// refit model; with Recalibrate = K > 0 the unpublished rest of the epoch is
// also replanned every K steps (when the step count stays the same). Each
// epoch records which model each step used (EpochInfo.Segments); plan_hash
// names the epoch's base plan.
//
// # Ownership and concurrency
//
// A Service is created by New and run once by Run, which supervises the
// embedded server, the publisher, the control handlers and the HTTP server
// together (errgroup) and drains them when ctx ends (SIGINT/SIGTERM in the
// command) or one fails. Ready, ClientURL, HTTPAddr, Stats, Handler and
// Registry are safe for concurrent use. The Service owns its NATS
// connection, embedded server and prepared epochs and releases them when Run
// returns.
package serve
