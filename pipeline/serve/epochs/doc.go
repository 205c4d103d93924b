// Package epochs is the epoch state of `mmfeed serve`: each epoch's plan
// (its order of the job's dataset, the base plan plan_hash names, the steps
// actually served, their recalibration segments and resize), the planning
// of it window after window in the background, and the book of every
// epoch's info, the only writer of that state and of its KV keys
// (epoch.<e>, InfoKey).
//
// # What it owns
//
//   - Plan (plan.go): one epoch prepared and planned. Prepare orders the
//     job's dataset for the epoch and plans its first window; the rest and
//     the strategy comparison are planned by one goroutine (planInBackground,
//     lookahead.go) that Close stops, unless a recorded Info must be
//     replayed (its segments, its resize), which plans the whole epoch
//     first. PrepareWhole opens a dataset of its own and waits for the
//     whole plan (tests, replays). A plan's readers use its verbs: Info,
//     Prepared, StepFeatures, SegmentAt, Predicted, ServedSteps, PlanFrom,
//     Planned, WaitPlanned, Planning, MixtureReport, FirstWindow.
//   - planning (lookahead.go): how far a plan is; a reader of step k waits
//     (WaitPlanned) until k is planned. SetPlanWindowHook slows the
//     background planner down in tests.
//   - Book (book.go): the job's epochs: their infos (what a register reply
//     needs), the plans held in memory (the active epoch, the one before,
//     the next one while it is planned ahead), one shared preparation per
//     epoch (Prepared, PlanAhead, PlanAheadDue), the goroutines it starts
//     (Background, WaitBackground), and the recalibration of a held plan
//     (ReplanRest: it replans, records and, when the record fails, rolls
//     back under its own lock). Record, RecordAll and Unrecord are the only
//     writers of the epoch.<e> keys, through the Store the service gives
//     NewBook (the job's KV bucket).
//   - Info, Segment, ResizeSegment (info.go): what the book records of an
//     epoch, as JSON at InfoKey(e); Validate checks one read back.
//   - Norm and StepBefore move a proto.Pos, the (epoch, step) position
//     every package of serve shares, across epoch boundaries.
//   - ErrNotReady, ErrState (serve's sentinel errors of those names).
//
// # Inputs
//
// A Config: the job's pipeline configuration, its name, the logger, the
// quarantine directory and whether to compare the other strategies. The
// book prepares an epoch with the PrepareFunc it is given (serve's
// planEpoch, which calls Prepare with the job's dataset, the model the
// epoch starts with and the job's work.QuarantineSink).
//
// # What it must not do
//
// It never imports pipeline/serve (internal/arch): it knows nothing of
// ranks, the data plane, the publisher or NATS (the KV bucket is its Store,
// and it imports no NATS package). No other package writes or deletes an
// epoch.<e> key (internal/arch's owner test); they read it (serve's restore)
// and change epoch state through the book's verbs only.
//
// # Ownership and concurrency
//
// The book's lock guards its maps, the active epoch and the parts of a held
// plan the publisher changes (its steps, features and info: ReplanRest)
// against readers elsewhere (Features, PlanFrom); it is a leaf but for a
// held plan's planning lock (itself a leaf), and no caller can take either.
// A plan's served steps and info are the publisher's: it calls the plan's
// verbs from its own goroutine; other goroutines read a held plan through
// the book (Features, PlanFrom), its planning (Planning, MixtureReport,
// WaitPlanned) or what never changes once prepared (Prepared). The
// background planner writes step k before it raises the planned count; a
// reader that saw it above k reads step k without a lock.
package epochs
