// Package serve is `mmfeed serve`: it plans each epoch of a dataset
// (pipeline, balancer), preprocesses the planned samples on all cores, and
// builds every (epoch, step, micro-batch, dp rank, mp rank) batch as Arrow
// IPC, following docs/protocol.md. On the core data plane (the default) it
// holds the batches in memory (its outbox) and sends each one, in chunks on
// core NATS, when its rank asks for it, dropping it when the rank
// acknowledges it; on the JetStream data plane it publishes them to a
// stream with one durable consumer per trainer rank. It answers the trainers' control
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
// credentials and TLS: natsenv.Config), stream bounds, the HTTP address,
// and the memory.Allocator the Arrow records are built with (Allocator;
// each record is released once encoded). Outputs are the
// stream's batches, the KV state, quarantine-e<epoch>.jsonl files, the HTTP
// endpoints (/v1/report, /metrics, /healthz, /: httpui) and Stats; with ReportOut,
// the run report (package report, written from reportglue.go):
// report-e<epoch>.json/.html once every rank trained past the epoch and
// report-latest.json/.html, also when Run returns (SIGTERM and ctx
// included), each written atomically: the epoch's strategy comparison, the
// live section, and the measured figures of every epoch (report's run
// record: each dp rank's step times, measured imbalance beside the
// predicted one on the same steps, quarantine, steps trained beside
// published). The live report's steps_trained counts the steps every rank
// acknowledged (the least next needed position); finished says only that
// everything is published.
//
// # Roles
//
// Config.Role RoleAll (the default) plans and preprocesses in the service.
// RolePlanner plans and delivers exactly as RoleAll does, and leaves the
// preprocessing to worker processes (package work: work.RunWorker, the
// worker side and the item wire; work.Planner, the planner side) or
// Config.LocalWorkers slots of its own,
// through the JetStream work-queue stream work.Stream: feature items
// (ranges of the dataset index; the planner assembles their features) and
// batch items (one dp rank's micro-batch, for every mp rank; issued
// WorkAhead steps ahead, heavy ones earlier: their time is predicted from
// megapixels by format, bytes and samples, fitted to the workers' times).
// Each publish has its own message id, kept by its retries, so the queue
// holds an item once across lost acks and stream leader elections; an
// attempt unanswered after 5 s (its request or ack left with a leader that
// died) is sent again, for up to 30 s, whatever the caller's deadline. Every
// role reads and fills the feature cache in work.FeatureBucket under the
// dataset's fingerprint (pipeline.Fingerprint). A worker needs only the NATS
// deployment: an item names the job's preprocessing config and tokenizer in
// the job's work.Bucket by hash, and the dataset by path (readable from
// every worker). A worker sends its encoded batches to the planner on core
// NATS and acknowledges the item once the planner holds them; it renews
// the item while it works, until the item's deadline (from its predicted
// time), so a dead worker's item is redelivered after WorkAckWait. The
// planner keeps one result per item (by content hash): duplicates are
// dropped, and the payloads are byte-identical to RoleAll's. Each result is
// checked against the item issued before it is kept (work.VerifyResult: config
// hash, schema metadata, rows, ids in order, costs, weights, token
// counts); one that does not match is counted, dropped and its item issued
// again. A worker that cannot build an item reports why; after
// work.ItemMaxFailures reports of one item the planner fails the job with
// that reason (ErrWorkFailed). The planner puts autoscaling gauges on
// /metrics (workmetrics.go, from work.Autoscaler and work.Planner's
// backlog): the undelivered items' predicted worker seconds, the
// trainers' consumption and demand (their data wait taken out) over a 30 s
// window, the slack before the earliest rank would wait, the measured
// seconds per item, the workers and their slots (each done message carries
// the worker's slots), and workers needed = demand × seconds per item ÷
// slots per worker. Work items and their subjects: docs/protocol.md
// section 12; what a worker credential can and cannot do:
// docs/security.md.
//
// # Leadership
//
// One service serves a job: Run first takes the job's lease (natsenv.Lease:
// a key with a TTL in the KV bucket mmfeed_<job>_lease) and renews it; a
// second service for the job stands by until the lease expires or is
// released, then starts from the durable state as after a restart. A
// service that cannot renew the lease for 3/4 of its TTL is fenced (its
// state writes wait: the state bucket is natsenv.Guard of the bucket with
// the lease's Await) until it holds the lease again; one that finds another
// holder stops (ErrLeaseLost). serve decides when (Run: acquire before the
// setup, release after the handlers' tasks ended) and what a failed write
// means for /healthz (Service.stored, assets.go); natsenv keeps the lease.
//
// # Delivery
//
//   - Each mp rank gets its modality's columns only (proto.ModalityFor): with
//     placement modality the vision rank gets pixels, the text rank tokens,
//     the same ids in the same order.
//   - The outbox (or the stream) is bounded (StreamMaxBytes): when trainers
//     are slow or absent the publisher waits (backpressure) and
//     preprocessing, which runs at most two steps ahead, waits with it.
//     Memory stays bounded. A rank waiting for its next batch always gets it
//     into the outbox, so trainers that hold a step cannot stall the service.
//   - A batch a rank asks for that was built and is no longer held is
//     rebuilt (a rewind with the next generation); the plan and the
//     preprocessing are deterministic, so it is byte-identical.
//   - Epoch e+1 is planned while e is published, and the epochs run back to
//     back, so there is no pause at the boundary. Every epoch is planned
//     from the dataset as the job opened it (pipeline.Dataset: indexed,
//     tokenizer opened, features computed or read from the cache once).
//   - Planning never stalls delivery: an epoch's preparation plans its
//     first lookahead window (balancer.Start, Planner.PlanNext) and
//     returns; the register reply (steps, plan_hash) is known from then on,
//     and the publisher serves the steps planned so far while one
//     background goroutine per epoch plans the rest in window order, then
//     builds the strategy comparison (the report says "planning k/n steps"
//     until then, and shows the epoch before meanwhile). A reader of step k
//     waits (ctx-bound) until k is planned; a recalibration waits until the
//     epoch is planned to the end (it replans the rest), and a restart that
//     replays recorded segments or a resize plans the whole epoch first.
//     plan_hash is balancer.Planner.Hash: the planner version, the plan's
//     inputs and its first window, so a restart compares it at once.
//   - Quarantined samples are recorded once each in the KV bucket
//     mmfeed_<job>_quarantine (keyed by sample id), and in the
//     quarantine-e<epoch>.jsonl files.
//   - A rank's batches are published in plan order; its cursor is the next
//     step to publish to it.
//
// # Resume
//
// The KV bucket mmfeed_<job> holds the job record (config: layout and a
// fingerprint of dataset, plan, tokenizer and image settings, with a hash
// per setting; a mismatching service refuses to start, naming what changed;
// a new job's record is written once its dataset opened, so a start that
// cannot open its input records nothing), each epoch's info (epoch.<e>: steps, plan
// hash, the cost-model segments), the current epoch, each rank's last
// completed step (positions, one key for all ranks, from feedback, done and
// a step's last ack, written at most every 100 ms: deliver/positionlog.go), each rank's
// generation (rank.<dp>.<mp>.gen), the last step each rank's fetch was sent a
// batch of (handed, one key for all ranks, core data plane; deliver/handedlog.go) and
// finished. On restart the service
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
// # Elastic resume
//
// With AllowResize a service may take over a job recorded at another dp
// (core data plane only; resize.go): nothing is published until the first
// register of the new layout names the resize point (its epoch and resume
// step: the trainers' checkpoint). That epoch's steps from the point on are
// replanned for the new dp from the samples the old plan had there
// (balancer.Plan.Resize), recorded in its EpochInfo.Resize so that a
// restart replays it; later epochs are planned for the new dp; the job
// record takes the new dp. Registers before the point are refused.
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
// A Service is created by New and run once by Run. Run starts NATS (the
// embedded server and the connection, within ctx), takes the job's lease,
// sets up the JetStream assets, installs the control handlers, then
// supervises its parts in one errgroup with Run's context: the lease
// renewal, the publisher, the progress log, the asset watch, the stream
// poll, the HTTP server (and the local workers). The first part to fail,
// ctx (SIGINT/SIGTERM in the command) or the publisher's end stops them
// all; a start that fails once parts run (the data subscriptions, the HTTP
// listener) stops and waits for them before Run returns. Ready, ClientURL, HTTPAddr, Stats, Handler and Registry
// are safe for concurrent use. The Service owns its NATS connection,
// embedded server, dataset and prepared epochs and releases them when Run
// returns.
//
// The Service composes parts that each own their state under their own
// lock, with the invariants documented on the type:
//
//   - deliver.Ranks (package deliver: ranks.go, handedlog.go,
//     positionlog.go): every rank's publish cursor, next needed step,
//     generation and connection, and their KV records (rank.<dp>.<mp>.gen,
//     the positions record of all ranks, written behind the acks, and the
//     handed record of all ranks, written for every rank waiting at once
//     before their batches go; each at most every 100 ms). serve gives it
//     the epoch book (deliver.Epochs: Norm, StepBefore) and the job's bucket
//     (deliver.Store: kvStore, state.go), and reads a rank through its
//     verbs (Cursor, Next, Gen, Get: a RankState copy). A generation is recorded before it is used; a cursor
//     moves forward only when the step's last micro-batch was handed over;
//     a rank's next needed step moves forward only over batches handed to
//     it (an ack of anything else is refused: deliver.Ranks.CheckAck).
//   - jobDataset (dataset.go): the job's pipeline.Dataset (index,
//     tokenizer, features), opened by the first epoch's preparation and
//     shared by every epoch's plan and preprocessing; Run closes it after
//     the epochs.
//   - the epoch book (epochs.Book, package epochs): the epochs' infos (KV
//     epoch.<e>: Record, RecordAll and Unrecord are the only writers of
//     those keys), the plans held in memory (the active epoch, the one
//     before, and the next one while it is planned ahead), one shared
//     preparation per epoch, the plan-ahead goroutines, which the publisher
//     waits for, and a held plan's recalibration (ReplanRest: it replans,
//     records and, when the record fails, rolls back under its own lock;
//     calibrate.go only fits). Each plan's planning (how far it is, the
//     comparison when built) is a leaf lock of its own; the plan's Close
//     stops its background planner and waits for it. serve prepares an
//     epoch for the book (planEpoch, planepoch.go) and gives it the KV
//     bucket (kvStore, state.go).
//   - deliver.Publisher (package deliver, publisher.go): the rewinds queued
//     for the publish loop (package produce), its wake-ups, the cancel of the run
//     in progress and whether everything is published. Only the loop
//     applies rewinds (Drain, Apply), through the rank table's verbs and
//     rewindGlue (publishglue.go: the data plane's drop, the rewinds
//     counter, the log). Each rank's publisher of a run
//     (deliver.PublishRank, rankqueue.go) hands its queued micro-batches to
//     the data plane through rankGlue.
//   - control.Control (package control): the trainers' control messages
//     (register, feedback, done, resend; the data plane's acks and fetches
//     are checked by it too). It holds only its gate (registers waiting,
//     resends in flight) and acts through the other parts, each an
//     interface of control's with verbs: the rank table (deliver.Ranks),
//     the epoch book, and the calibrator, live report, metrics, tasks,
//     data plane, publish loop and resize decision through controlGlue
//     (controlglue.go). A message moves a rank forward only to what it
//     acknowledged and back only to what it has not.
//   - deliver.DataPlane (package deliver, deliver/plane.go): how the
//     batches reach the trainers, chosen once in New from Config.DataPlane
//     (newDataPlane, plane.go); nothing else in serve branches on the plane
//     (internal/arch). deliver.CorePlane holds them in the outbox
//     (deliver.Outbox, which owns its lock), answers the ranks' fetches and
//     acks (deliver.Core, coreplane.go, with one deliver.FetchWaits per
//     rank) and the viewers' fetches (deliver/view.go, viewsubject.go:
//     from the outbox, or the batch built again by produce's
//     BuildView); deliver.StreamPlane (deliver/streamplane.go) publishes them
//     to the job's stream with retries, polls the stream's state, recreates
//     a lost stream or consumer and resets a rank's consumer for a new
//     trainer incarnation. The plane holds a batch, drops a rank's batches
//     on a rewind, says where a restarted service continues (nothing
//     outlives it on the core plane), whether a resize can be served, which
//     subscriptions, loops and assets it needs, and what it holds
//     (Gauges). serve's side is coreGlue (publishglue.go) and streamGlue
//     (plane.go).
//   - control.Guard (package control, replyscope.go): every request is
//     answered only on the requester's own inbox namespace (never $KV, $JS,
//     another identity's inbox or the service's own, ServiceInboxPrefix); a
//     request with another reply subject is dropped, counted and logged at
//     most once a second (control.RateLog, which serve's other floods of
//     warnings share: Service.rlog).
//   - tasks (tasks.go): every goroutine started for a message (a register,
//     done, resend, fetch or viewer fetch). Tasks run with Run's context
//     and Run waits for them before it returns: no goroutine of the service
//     outlives Run.
//   - calibrator (calibrate.go), live (report.State), health (assets.go):
//     the cost-model observations, the live report and /healthz's state;
//     the live report's run record (report/record.go, a leaf lock) keeps
//     the whole run's measured figures, and reportOut (reportglue.go)
//     writes them from its own goroutine and once more after the parts
//     stopped. report.Views (report/liveview.go, a leaf lock) caches the
//     fit history the page's live section shows, one for the HTTP server
//     and one for the run report.
//   - work.Planner (package work, planner role): the issued items, their
//     results, the item cost model and its tallies, and the feature
//     passes; work.Autoscaler: the ranks' step advances and data waits and
//     the workers' finished items, each kept for the window. serve reads
//     them through their methods (workglue.go, workmetrics.go: snapshots
//     at scrape time; the publish loop issues and awaits the items,
//     produce/remote.go), never under their locks.
//
// Lock order: deliver.Ranks before the epoch book (positions are normalised with
// the epochs' step counts); every other part's lock is a leaf. A Prometheus
// scrape reads memory only (positions, the outbox, the stream state the
// JetStream plane polls: DataPlane.Gauges): it makes no NATS or JetStream
// request.
//
// # Packages
//
// serve is being split into packages whose boundaries are the owners
// (issue 24). Out of it so far:
//
//   - natsenv (pipeline/serve/natsenv): the embedded server
//     (StartEmbedded), the service's connection (Connect), the job's
//     credentials and permissions (JobIdentities, AuthConfig), the TLS
//     files (WriteTLS), the names of the assets they scope (work stream,
//     consumer, subjects and buckets, quarantine and lease buckets), the
//     job's JetStream assets (Assets: the state, quarantine and lease
//     buckets, the stream and the rank consumers, each with an Ensure verb
//     that setup and the asset watch's recreation call; Config.assets
//     declares them), the leadership lease (Lease, lease.go) and the fenced
//     state bucket (Guard, with the full disk's cause StorageCause,
//     guardkv.go). serve owns the server and the connection it returns, and
//     the lease from Acquire to Release; the asset watch (its streaks,
//     escalation and what a recreated asset gets written back) and
//     /healthz's record of state writes (Service.stored) stay in serve
//     (assets.go). serve's ErrInvalidConfig, ErrInsecure, ErrLeaseLost,
//     ErrLeaseFenced and ErrStorageFull are natsenv's.
//   - httpui (pipeline/serve/httpui): the report's HTTP server (limits,
//     listener, TLS), its routes (/healthz, /v1/report, /v1/cost-model,
//     /metrics with the Go runtime's collectors, /), the browser's sign-in
//     and session cookie, and the page's handler. It answers from
//     httpui.Source, which serve implements (httpsource.go: health,
//     snapshot, planningStatus, costModel, and the live section with its
//     fit history, report.Views, which the run report shares);
//     Service.Handler and Run's HTTP part are httpui.New of the service's
//     Config. The run report is package report's.
//   - epochs (pipeline/serve/epochs): epoch plans (epochs.Plan: prepare,
//     plan window after window in the background, replay, resize, replan;
//     the served steps and their features), the epoch book (epochs.Book)
//     and what it records (epochs.Info, Segment, ResizeSegment, under
//     serve's names EpochInfo, Segment and ResizeSegment). It is the only
//     writer of epoch state and of its KV keys (epochs.InfoKey); serve's
//     readers use the plan's and the book's verbs and never their locks.
//     serve keeps the Service's side: planEpoch and epoch (planepoch.go),
//     the resize decision (resize.go), the recalibration's fit
//     (calibrate.go). serve's ErrNotReady and ErrState are epochs'.
//   - the CPU work-cost model: balancer.WorkCostModel, beside the other
//     cost models and sharing their least-squares solve; package work
//     builds an item's cost from the features (work/itemcost.go) and
//     work.Planner holds the model under its lock.
//   - the planner side of the work queue (pipeline/serve/work): work.Planner
//     (work/planner.go: issue, wait, forget; work/result.go: the result and
//     done handlers, rejects; work/features.go: the feature passes and the
//     feature cache; work/times.go: predicted against measured item
//     times), work.Autoscaler (work/autoscale.go) and work.ShardWorkers
//     (work/shard.go: `mmfeed shard --nats`). serve keeps the glue that
//     needs the Service: setupWork and the feature-pass wiring
//     (workglue.go), the counters and gauges (workmetrics.go); the
//     planner role's publish loop (the steps' items issued, the workers'
//     payloads queued to the ranks) is package produce's (remote.go).
//   - the throughput harness (Throughput, PlannerThroughput, with pprof
//     labels and rusage): bench/, which reaches the embedded server through
//     Service.DialInProcess.
//   - deliver (pipeline/serve/deliver): the core data plane's outbox
//     (Outbox: the batches built and not yet acknowledged, its byte bound
//     the backpressure), the fetches waiting for a batch (FetchWaits), the
//     rank table (Ranks), the publisher's run state and rewind queue
//     (Publisher, publisher.go) and the rank publishers with their queues
//     (PublishRank, rankqueue.go), and the core plane's fetch answer
//     (Fetches.Answer, fetchanswer.go), and the core plane's fetch and ack
//     handlers that decode and check the requests (Core, coreplane.go: its
//     subscriptions and sends on the service's connection; the rest of
//     what it needs is its CoreParts, serve's coreGlue), and the two data
//     planes (DataPlane: CorePlane with the viewers, StreamPlane with the
//     stream publish, poll and asset recreation; plane.go, streamplane.go,
//     view.go, viewsubject.go), over the parts they are given
//     (CorePlaneParts, StreamParts: serve's coreGlue and streamGlue, which
//     pass the assets' Ensure verbs, the metrics, the health and the log).
//     Of NATS it imports nats.go and jetstream (never the server). serve
//     chooses the plane (newDataPlane, plane.go) and turns its Gauges into
//     the metrics (metrics.go). The batches it delivers are made by
//     produce (below), which also rebuilds a viewer's batch (BuildView).
//   - control (pipeline/serve/control): the control handlers (register,
//     feedback, done, resend: control.go), their refusal codes and gate,
//     the reply guard (replyscope.go) and the rate log (ratelog.go). It
//     turns a message into verbs on the parts it is given (parts.go:
//     Ranks, Epochs, Calibrator, Report, Metrics, Tasks, Plane, Delivery);
//     serve implements them (deliver.Ranks, epochs.Book, controlglue.go), creates the
//     guard and the handlers (setupControl); the data plane's fetch, ack
//     and view handlers (package deliver) call control's CheckRank,
//     BadControl, SetNext and the guard's Allow through serve's coreGlue. serve's ErrEpochRange is
//     control's.
//   - report (pipeline/serve/report): what the service reports. The live
//     report's state (report.State: the epochs shown, the newest published
//     steps with their measured times, every epoch's quarantine, the run
//     record; Snapshot), the report's JSON types (LiveReport, Live,
//     RunReport, EpochMeasured, ...; Stats, under serve's name Stats), the
//     run report's files (WriteRunFiles, the HTML's measured section), the
//     page's live section with its fit history (Views, over the
//     calibrator's Observations) and the progress line's arithmetic
//     (ProgressMeter). serve keeps the glue that needs the Service
//     (reportglue.go: snapshot and liveSnapshot, which add the job, the
//     ranks, the steps trained, the calibration and the throughput; the
//     run report's writer reportOut with reportLoop, epochEnds and atExit,
//     runReport, stepsTrained, stepsTotal; trained and logProgress).
//   - produce (pipeline/serve/produce): the publish loop that makes the
//     batches (produce.Producer: Run, from the ranks' cursors epoch after
//     epoch, applying the publisher's rewinds between runs; each step
//     preprocessed, or its items issued to the workers and their payloads
//     awaited with the planner role, encoded for the ranks at it and
//     queued to the rank publishers; BuildView, a viewer's batch built
//     again from the plan). It acts on the rank table and the publisher
//     through their verbs and on the rest through its own interfaces
//     (parts.go: Epochs, Report, Metrics, Service); serve implements them
//     and creates the Producer in prepare (produceglue.go: newProducer,
//     the Producer's parts) and runs Run as the publisher part
//     (startPublisher).
//
// internal/arch tests the import rules between them (natsenv imports proto
// and internal/ctxutil only, httpui balancer only, deliver proto and
// internal/ctxutil only and of NATS nats.go and jetstream (never the
// server, natsenv nor prometheus), work never serve nor prometheus, epochs
// neither serve nor NATS, control neither serve, deliver nor prometheus and
// of NATS nats.go only, report never
// serve, prometheus nor a NATS package, produce never serve, prometheus
// nor a NATS package (Arrow and errgroup only outside the module); none of
// serve, natsenv, deliver, work, epochs, control, report, produce and
// httpui imports runtime/pprof), that
// only epochs writes epoch.<e> keys, the size limits, and that serve creates
// no KV bucket, stream or consumer itself and only natsenv names the lease
// key in a call (natsenv_test.go).
//
// Re-planning is the balancer's: a recalibration replans the rest of an
// epoch with balancer.Plan.Replan, a resize with balancer.Plan.Resize; the
// service records the segments and replays them after a restart.
package serve
