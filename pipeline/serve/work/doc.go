// Package work is the worker side of `mmfeed serve --role planner`: the
// process `mmfeed worker` runs (RunWorker) and the item wire the planner and
// its workers share (docs/protocol.md section 12).
//
// # What it owns
//
// The wire: the work-queue stream and its consumer (Stream, Consumer,
// EnsureQueue), a job's object store of preprocessing configs and tokenizer
// files (Bucket, EnsureBucket, Config, NewConfig), the items on it
// (BatchItem with its Samples and Key, sealed by content hash; FeatureItem),
// their subjects (ItemsSubject, ResultSubject, FeaturesSubject), the headers
// of a result (Hdr*) and the planner's answers to it (Answer*). A batch
// result is checked against the item issued by VerifyResult (a
// *ResultError with one of RejectReasons, or nil), and every batch payload,
// served or built on a worker, is encoded by EncodeRows. A job's quarantine
// records go to its quarantine bucket through a QuarantineSink, one record
// per sample (QuarantineKey), whoever found it.
//
// The worker: RunWorker connects (natsenv), waits for the queue, and takes
// items on WorkerConfig.Slots slots until ctx ends. It opens a job's dataset
// once per config (at most a few at a time), renews an item while it builds
// it, sends the payloads in chunks and acknowledges the item once the
// planner holds them, reports a failure that comes from the job's input,
// and leaves to other workers the items of a job its credential does not
// cover. A planner with local workers passes its own connection
// (WorkerConfig.Conn). Attach gives a caller that takes items itself (a
// test's forger) a worker's Build and Send.
//
// # What it must not do
//
// It plans nothing and holds no job state: what to issue, when to reissue,
// which result to keep and what to deliver to the trainers is the planner's
// (package serve: workqueue.go, workresult.go, workfeatures.go). It imports
// pipeline, proto, natsenv and the core packages, never pipeline/serve
// (internal/arch); serve uses it through these exported names only.
//
// # Ownership and concurrency
//
// A Worker's datasets and refusals are its own, guarded by its own locks;
// RunWorker owns the connection it opens and closes it, and never closes
// WorkerConfig.Conn. The wire functions hold no state and are safe for
// concurrent use.
// ErrJobMismatch is serve.ErrJobMismatch.
package work
