// Package deliver holds what `mmfeed serve` delivers to the trainers until
// they have it, and where each rank is: the batches built and not yet
// acknowledged, the fetches that wait for a batch (docs/protocol.md, the
// core data plane), every rank's positions with their KV records (the
// rank table), the publish loop's shared state (the publisher: its
// rewinds and runs), the core data plane's fetch and ack handlers, its
// viewers, and the two data planes themselves (DataPlane: core or
// JetStream).
//
// # What it owns
//
// The outbox (Outbox, NewOutbox): every rank's encoded batches (Item,
// NewItem), in plan order per rank, from the moment they are built until the
// rank acknowledges them (Ack) or a rewind drops them (Purge). Its byte
// bound is the backpressure between preprocessing and the trainers: Put
// waits while the outbox is over it, unless the rank holds nothing its
// trainer has not fetched or a fetch of the rank waits for this batch or a
// later one (Want), so a trainer that waits for its next batch always gets
// it. Lookup hands a batch to a fetch (marking it sent) or returns the
// channel closed at the next change of that rank's batches only; Peek reads
// one without marking it (a viewer's copy); First is the first batch held
// for a rank; Size is the bytes held (the outbox_bytes gauge).
//
// The fetch waits (FetchWaits, one per rank): one waiting fetch per batch,
// which a later fetch of the same batch joins (Join: the newest reply
// subject, FetchWait from the newest fetch), until the batch is sent
// (Claim), the wait expires (Left) or the fetch gives up (Leave). KeyLess is
// the order of one rank's batches.
//
// The fetch answer (Fetches, NewFetches; fetchanswer.go): Answer answers
// the fetches a Waiter stands for. A batch the outbox holds is sent
// (FetchParts.Send) only once the rank table recorded it as handed
// (Ranks.Hand; when that fails nothing is sent, FetchParts.HandFailed, and
// the rank asks again); a batch that was built (the rank's cursor is past
// its step) and is no longer held is regenerated: the publisher is asked to
// rewind the rank to its step (Publisher.Request), and the batch is sent
// once it is held again. While it waits, the outbox knows the rank wants
// the batch (Want); it gives up when FetchWait from the newest fetch ends.
//
// The rank table (Ranks, NewRanks; ranks.go): every rank's publish cursor,
// next needed step, replay generation, connection and last handed batch,
// read as a copy (Get, All: a RankState, through its accessors) or one at a
// time (Cursor, Next, Gen), and moved only by its verbs: the publisher's
// (MinCursor, Targets, WaitTurn, StepPublished, Normalize, AllNeed,
// Rewound), the control handlers' (SwapConn, SetNext, Trained), the fetch
// and ack handlers' (Hand; CheckAck, the core plane's ack rule: an ack moves
// a rank only over batches handed to it), a resize's (ResetAll) and a
// restore's (Load, Set). It is
// the only writer of the ranks' KV records: rank.<dp>.<mp>.gen (RankGenKey,
// written by Rewound before the table holds the generation), KeyHanded (the
// handed log, handedlog.go: Hand returns only once the record holds the
// batch's step, so a batch is sent only after its handed record is written,
// and when the write fails nothing moves), KeyPositions (the position log,
// positionlog.go: every rank's last completed step, written behind the acks
// by RunPositions and FlushPositions) and, for a recreated bucket, all of
// them (Rewrite). It reads the per-rank keys of earlier services when the
// records are absent. RanksRecord and KVStep are the records' JSON.
//
// The publisher (Publisher, NewPublisher; publisher.go): what the publish
// loop (package produce) shares with the rest of the service. The rewinds asked of it
// (Request, a Rewind: republish a rank from a step with a new generation,
// answering Done), queued until the loop applies them between runs (Rewinds,
// Drain, Apply); its wake-ups (Poke, Woken); the cancel of the run in
// progress (StartRun refuses a run while a rewind is queued, and Request
// cancels the one running, EndRun); whether every batch is published
// (Finish, news once, and Finished); the stream-room warning given once
// (RoomWarned, ClaimRoomWarning); the recalibration count
// (RecalibrationDue) and a test's hook on each batch handed to the plane
// (SetBuilt, Built). Apply does nothing when the rank's cursor has not
// reached the rewind's step; otherwise it drops what the data plane holds
// for the rank, records the next generation (Ranks.Rewound: the KV record
// first, so a restarted service never reuses a purged message id) with the
// cursor at the step, then reports it; a failed step moves nothing further.
//
// The rank publishers' queues (rankqueue.go): a run's encoded micro-batch
// (Out, NewOut: key, generation, payload, real samples, whether the step's
// last) is queued to its rank's publisher (QueueOut, which counts the real
// samples on mp rank 0 only; StepQueue steps per rank at most), and
// PublishRank hands one rank's queue to the data plane in order: a step's
// first micro-batch waits for every rank to be at the step
// (Ranks.WaitTurn), and after its last the rank's cursor moves on
// (Ranks.StepPublished).
//
// The core data plane's handlers (Core, NewCore; coreplane.go): Subscribe
// installs one fetch subscription per rank, the viewers' (through its
// CoreParts) and one ack subscription for all ranks on the service's
// connection. A fetch is decoded and checked (CheckFetch: the rank's own
// subject, a reply subject, an epoch of the job), its reply subject must
// pass the reply guard, a viewer fetch goes to the viewers, and a rank's
// fetch joins the wait for its batch (FetchWaits) or takes one of the
// rank's 32 slots and is answered (Fetches.Answer, on a task of its own);
// Send sends a held batch in chunks (proto.SendBatch). HandleAck checks an
// ack (its rank, its subject, the reply guard, Ranks.CheckAck), drops the
// acknowledged batch from the outbox, answers it while the job's state can
// be written, and after a step's last micro-batch records the rank's next
// step.
//
// The data planes (DataPlane; plane.go, streamplane.go): how the batches
// reach the trainers, one interface the service asks instead of branching
// on the plane (Setup, Hold, Drop, FirstHeld, RestoredCursor, Resizable,
// FillRegisterReply, TrainerReplaced, Subscribe, Run, CheckAssets,
// Gauges). CorePlane (NewCorePlane) owns the outbox (Setup creates it, with
// the chunk size the connection's max_payload allows), installs Core's
// handlers and the viewers' (Subscribe), and answers a viewer fetch
// (view.go, viewsubject.go: on the rank's view subject or a fetch with
// View set; a request of the subject's own rank with a reply subject in a
// viewer's inbox, at most maxViews at once, on a task of its own) with the
// outbox's copy of the batch or the batch the service builds again
// (CorePlaneParts.BuildView), never marking it sent nor moving the rank.
// StreamPlane (NewStreamPlane) owns the job's stream handle and the stream
// publisher (Setup creates the stream and every rank's consumer through
// StreamParts), publishes a batch with retries (the same message ids until
// ctx ends or GiveUpAfter; a too large or invalid batch is not retried),
// purges a rank's subject on a rewind, continues a restarted service after
// the last batch the stream stores for a rank, recreates a lost stream
// (rewinding every rank to its next needed step through the publisher) or
// consumer (CheckAssets), resets a rank's consumer for a new trainer
// incarnation, and polls the stream's and consumers' state every
// PlaneConfig.Poll (Run) so that Gauges reads memory only. A resize is
// served by the core plane only (the JetStream plane's refusal wraps
// PlaneConfig.JobMismatch). Gauges is data (PlaneGauges): the outbox's
// bytes, or the last stream snapshot (StreamGauges, a copy).
//
// # Inputs
//
// The rank table is given the epoch book as Epochs (Norm and StepBefore:
// positions move across epoch boundaries) and the job's KV bucket as Store
// (serve's fenced bucket; nil, or a Store whose Bucket is false, keeps
// Hand's record in memory only, a test's). A write the bucket refuses (a
// fenced or released lease) fails the verb that needed it.
//
// The publisher's Apply is given the rank table and RewindParts: the data
// plane's drop of a rank (Drop) and the service's record of a rewind applied
// or failed (Rewound, RewindFailed: serve's rewindGlue, publishglue.go,
// counts and logs). Fetches are given the outbox, the rank table, the
// publisher and FetchParts: the send of a batch on a fetch's inbox (Send:
// Core.Send, proto.SendBatch) and the log of a handed record not
// written (HandFailed). PublishRank is given the rank table and RankParts: the
// data plane's hold of a micro-batch (Hold) and the published counters
// (Published: serve's rankGlue). Core is given the service's NATS
// connection, the job's CoreLayout (job, ranks, epochs, micro-batches,
// chunk size), the outbox, the rank table, the publisher and CoreParts
// (serve's coreGlue, publishglue.go): control's CheckRank, BadControl and
// SetNext, the reply guard's Allow, the viewers (StartView,
// SubscribeViews), the handlers' task group (Start), the metrics and logs
// as verbs (Fetched, Sent, SendFailed, HandFailed) and whether the state
// can be written (Recording).
//
// The planes are given PlaneConfig (the job's layout, its plane's name,
// the bound of what it holds, the JetStream plane's publisher tuning, give
// up, poll interval, the error a refused resize wraps, and the log), the
// rank table, the publisher and their parts: CorePlaneParts (HandlerParts,
// the connection, BuildView and the viewer's reply guard, AllowView:
// serve's coreGlue) or StreamParts (the connection and its JetStream, the
// assets' EnsureStream and EnsureConsumer as verbs, Recreate, the health's
// Publishing, the metrics and log Retried, Sent and PublishFailed:
// serve's streamGlue); the JetStream plane also the epoch book (Epochs:
// where a rank continues after its last stored step). serve reads which
// plane runs once (newDataPlane) and constructs one of them.
//
// # What it must not do
//
// It decides nothing else about the positions: what a fetch may get, when
// to rewind and which data plane runs are the service's (package serve:
// newDataPlane in plane.go chooses the plane from its Config; the batch a
// viewer gets built again, package produce's BuildView; the publish
// loop, package produce, which asks the publisher for its rewinds and
// runs).
// Of NATS it imports nats.go and its jetstream package: Core's and the
// viewers' subscriptions, the acks' answers and the batches' sends on the
// connection it is given, and the JetStream plane's stream (publish,
// purge, message reads, info, consumers). It creates no JetStream asset
// itself (the assets' declarations are serve's and natsenv's, reached
// through StreamParts' Ensure verbs; it never imports natsenv), makes no
// other NATS request (the bucket is its Store, the data plane a rewind
// drops from is its RewindParts), imports neither the NATS server nor the
// metrics (Core and the planes count through their parts; Gauges is data
// serve turns into metrics), and imports proto and internal/ctxutil and
// nothing else of this module, never pipeline/serve or
// pipeline/serve/epochs (internal/arch); serve uses it through these
// exported names only.
//
// # Ownership and concurrency
//
// An Outbox and a FetchWaits each own their state under their own lock,
// which is a leaf: no method calls out while holding it. Both are safe for
// concurrent use. An Item is immutable once built, but for whether a fetch
// was answered, which only the Outbox reads and writes under its lock.
//
// The rank table owns its state under its lock, taken before the epoch
// book's (it normalises positions with Epochs under it) and never held
// across a KV write; a per-rank lock serialises a rank's Hand, and the
// handed and position logs each own their lock (leaves, not held across
// their writes). The advanced hook (SetAdvanced) is called without the
// table's lock. All of it is safe for concurrent use.
//
// The publisher's run state is under its own leaf lock (the cancel, held
// while Request cancels the run: a CancelFunc calls nothing of the
// service's). Request, Poke, Finished, RoomWarned and ClaimRoomWarning are
// safe for concurrent use; Drain, Apply, StartRun, EndRun, Finish and
// RecalibrationDue are the publish loop's, from its goroutine; SetBuilt is
// set before the service starts. Apply takes no lock of its own across
// RewindParts or the rank table's verbs. Each rank's PublishRank runs on a
// goroutine of its own and holds no lock across its RankParts; each Answer
// runs on the fetch's goroutine and holds none across its FetchParts. Core
// has no state of its own but each rank's fetch waits and slots; its
// handlers run on the connection's goroutines and hold no lock across its
// CoreParts.
//
// A plane's state (the outbox, the chunk size and the viewers of the core
// plane; the stream handle and the stream publisher of the JetStream plane)
// is set by Setup before the service starts its parts and only read after;
// the JetStream plane's last snapshot is an atomic pointer, written by Run
// and read by Gauges. The viewers' slots are a semaphore of maxViews. No
// plane holds a lock across its parts. Hold and Drop are the publish
// loop's (a rank's publisher, a rewind) and Setup is called once before
// the parts start; the rest is safe for concurrent use.
package deliver
