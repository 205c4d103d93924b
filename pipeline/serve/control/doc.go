// Package control answers the trainers' control messages of `mmfeed serve`
// (docs/protocol.md, the control subjects mmfeed.<job>.ctl.*): it validates
// each message (payload, job, layout, the rank its subject names, the reply
// subject) and turns it into verbs on the parts that own the state.
//
// # What it owns
//
//   - Control (control.go): the register, feedback, done and resend
//     handlers (Subscribe installs them on the job-wide and on the rank
//     control subjects), the refusal codes of a register reply
//     (refusalCode: not_ready, end, invalid, failed; ErrEpochRange), and
//     the gate that bounds what a flood can start: registers waiting at
//     once (MaxWaitingRegisters; more are answered "failed" at once) and
//     one resend in flight per rank (a later one is merged into it). Its
//     wrappers refuse a message on a rank subject whose payload names
//     another rank (rankChecked) and one whose reply subject is outside the
//     requester's inbox (replyChecked). CheckRank, BadControl and SetNext
//     are the same checks and moves for the data plane's fetch, ack and
//     view handlers, which stay in serve.
//   - Guard (replyscope.go): every request is answered only on the
//     requester's own inbox (natsenv.CheckReply; SetStrict when per-user
//     permissions scope each credential's inbox); Allow drops, counts and
//     logs a request with another reply subject, RankInbox and ownOf say
//     whose inbox that is, WorkReplyOK is the same check for the work
//     planner's result handlers (work.Planner.GuardReplies).
//   - RateLog (ratelog.go): at most one WARN line per kind a second, the
//     lines held back counted on the next one.
//
// # Inputs
//
// A Config (the job, its layout, its epochs, Pack, RegisterWait) and the
// Parts it acts through, each an interface declared here with verbs only:
// Ranks (the rank table: Cursor, Next, Gen, SwapConn, SetNext), Epochs
// (the epoch book, *epochs.Book: Norm, WaitInfo, Features), Calibrator,
// Report (the live report), Metrics (what it and the guard count; it holds
// no Prometheus type), Tasks (the goroutines it starts, which end with the
// service), Plane (the data plane: FirstHeld, FillRegisterReply,
// TrainerReplaced) and Delivery (the publish loop's Rewind and Poke, the
// resize decision). serve's controlGlue implements them on the Service's
// parts.
//
// # What it must not do
//
// It never imports pipeline/serve, nor deliver or another package's
// internals (internal/arch): it imports epochs for its Info, Features and
// ErrNotReady only and reaches the book through Epochs. It never ends a job
// or drops a batch on a message alone: a rank moves forward only to what it
// acknowledged (the data plane's first held batch, or the publish cursor),
// and back (a resend, a register from an older checkpoint) only to what it
// has not. It writes no KV key: the rank table records the positions SetNext
// gives it.
//
// # Ownership and concurrency
//
// Its only state is the gate's (under its own leaf lock), the guard's
// strict flag (an atomic) and the rate log's (a leaf lock); everything else
// belongs to the parts, and it takes no other package's lock. Every
// goroutine it starts runs under Tasks, so none outlives the service. The
// handlers are safe for concurrent use.
package control
