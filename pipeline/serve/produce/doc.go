// Package produce makes the batches of `mmfeed serve`: the publish loop
// that turns each epoch's plan into every rank's encoded micro-batches and
// queues them to the rank publishers (package deliver gets them to the
// ranks).
//
// # What it owns
//
// The publish loop (Producer, New; loop.go). Run publishes every epoch of
// the job from the ranks' cursors on: between runs it applies the rewinds
// queued on the publisher (deliver.Publisher: Drain, Apply); a run
// (Publisher.StartRun, EndRun) starts one rank publisher per rank
// (deliver.PublishRank, with its queue of StepQueue steps) and, epoch after
// epoch without a pause at the boundary, preprocesses the steps planned so
// far (pipeline.Preprocessor, waiting for the next ones to be planned),
// builds and encodes each step's micro-batches for the ranks whose next
// position is at it (deliver.Ranks.Targets; the ranks in parallel, on all
// cores; work.EncodeRows with the epoch's BatchMeta and the rank's modality,
// proto.ModalityFor) and queues them in plan order (deliver.QueueOut).
// After each queued step it plans the next epoch ahead when due and asks
// for a recalibration, which ends the run when it replanned the rest of the
// epoch; a rewind asked meanwhile cancels the run (the publisher's cancel),
// and the loop starts again from the ranks' cursors. Once every batch is
// published it says so once (Publisher.Finish, the finished record, the
// log) and, with WaitForTrainers, keeps serving rewinds until every rank
// completed the last epoch. It warns once when a step of every rank takes
// more than half of StreamMaxBytes (Publisher.ClaimRoomWarning).
//
// With the planner role (Parts.Work set; remote.go) the steps' rows are
// built by workers: the loop issues each step's batch items WorkAhead steps
// ahead (heavy ones earlier), re-issues rejected ones, and queues each
// rank's payloads in plan order as the workers deliver them (work.Planner:
// IssueStep, Wait, ForgetStep), the same micro-batches RoleAll builds.
//
// BuildView (view.go) builds one batch of a rank again from the epoch's plan
// held in memory, with the same preprocessing and encoder, for a viewer: it
// quarantines nothing and moves nothing of the rank.
//
// # Inputs
//
// A Config (the job, mp, the last epoch, micro-batches, the placement, the
// image policy, the stream bound, WaitForTrainers) and Parts: the log, the
// Arrow allocator, the rank table and the publisher (package deliver's
// types, through their verbs), the publisher's and the rank publishers'
// parts (deliver.RewindParts, deliver.RankParts), the planner role's
// work.Planner (nil with role all), and what it needs of the Service as
// its own interfaces: Epochs (the epoch book's verbs and the service's
// Epoch, which makes an epoch the one being published), Report (the live
// report's Published), Metrics (the stages' times and the steps'
// imbalance as verbs) and Service (AwaitResize, RecalibrateDue and the
// finished record, RecordFinished). serve implements them
// (produceglue.go), creates the Producer once its work queue is set up
// and runs Run as one of its parts.
//
// # What it must not do
//
// It holds no state of its own beyond its Config and Parts: the run state,
// the rewinds and the cursors are the publisher's and the rank table's,
// the plans the epoch book's, and it changes them only through their
// verbs, never under their locks. It writes no KV record itself (the
// finished record is the Service's RecordFinished) and decides nothing
// about the data plane (the rank publishers hand the batches to
// RankParts). It imports pipeline, epochs, deliver, work, proto and the
// core packages of this module, never pipeline/serve; outside the module it
// imports only Arrow's allocator and errgroup: no NATS package and no
// metrics (internal/arch).
//
// # Ownership and concurrency
//
// Run is called once, on the service's publisher goroutine, and returns
// when every batch is published (and, with WaitForTrainers, trained), or
// ctx ends, or a part fails; the goroutines it starts (the rank publishers,
// the ranks' encoders) end before it returns, and it waits for the epochs'
// plan-ahead too (Epochs.WaitBackground). BuildView may be called
// concurrently with Run.
package produce
