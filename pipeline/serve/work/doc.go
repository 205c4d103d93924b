// Package work is the work queue of `mmfeed serve --role planner`: the
// planner's side (Planner, Autoscaler, ShardWorkers), the process `mmfeed
// worker` runs (RunWorker) and the item wire the planner and its workers
// share (docs/protocol.md section 12).
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
// The planner (planner.go, result.go, features.go, times.go): a Planner
// issues the batch items of a plan's steps (IssueStep, from an ItemSource:
// the features, the epoch, the image policy and each rank's batch
// metadata), heavy ones early; takes the workers' results on its
// subscriptions (Subscribe), keeping one verified result per item and
// issuing again an item whose result was rejected (ReissueRejected); hands
// each rank's payload over in plan order (Wait) and forgets a step once it
// is handed over (ForgetStep); Reset forgets everything and purges the
// job's items (a new run). Features is a pipeline.FeatureFunc whose feature
// items the workers compute; FeatureCache is the features' object store by
// dataset fingerprint (FeatureBucket). An item the workers report failed
// ItemMaxFailures times fails with ErrWorkFailed. The planner times the
// items against its cost model (itemcost.go, balancer.WorkCostModel; Times,
// Total, CostCoefficients, LogTally) and counts them (Counts). An
// Autoscaler (autoscale.go) keeps the observations the autoscaling gauges
// are computed from (Snapshot); the planner feeds it the finished items,
// serve the ranks' advances and waits. ShardWorkers (shard.go) is the
// planner of `mmfeed shard --nats`: a pipeline.StepSource whose rows the
// workers build.
//
// # What it must not do
//
// It plans no epoch and holds no job state beyond the items in flight:
// which epoch and steps to issue, for which ranks, and what to deliver to
// the trainers is the publish loop's (package produce, remote.go). It
// exposes numbers, never metrics: serve registers the collectors
// (workmetrics.go) from Counts, Total, CostCoefficients, BacklogSeconds and
// Autoscaler.Snapshot. It imports pipeline, proto, natsenv and the core
// packages, never pipeline/serve nor prometheus (internal/arch); serve uses
// it through these exported names only.
//
// # Ownership and concurrency
//
// A Worker's datasets and refusals are its own, guarded by its own locks;
// RunWorker owns the connection it opens and closes it, and never closes
// WorkerConfig.Conn. The wire functions hold no state and are safe for
// concurrent use. A Planner's slots, timings, cost model and tallies are
// guarded by its lock, which no caller takes: every method returns a
// snapshot or a copy. Its feature results and its Autoscaler have their own
// leaf locks, taken under the planner's (a done message) or alone. A
// Planner never closes the connection it is given; ShardWorkers owns the
// one it opens (Close).
// ErrJobMismatch is serve.ErrJobMismatch.
package work
