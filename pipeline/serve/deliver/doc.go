// Package deliver holds what `mmfeed serve` delivers to the trainers on the
// core data plane until they have it: the batches built and not yet
// acknowledged, and the fetches that wait for a batch (docs/protocol.md,
// the core data plane).
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
// # What it must not do
//
// It holds no position, generation or KV record and decides nothing about
// them: what a fetch may get, when an ack moves a rank, when to rewind and
// which data plane runs are the service's (package serve: the dataPlane
// interface in plane.go, with its core and JetStream implementations;
// dataplane.go's fetch and ack handlers; the rank table). It makes no NATS
// request and imports proto and nothing else of this module, never
// pipeline/serve (internal/arch); serve uses it through these exported
// names only.
//
// # Ownership and concurrency
//
// An Outbox and a FetchWaits each own their state under their own lock,
// which is a leaf: no method calls out while holding it. Both are safe for
// concurrent use. An Item is immutable once built, but for whether a fetch
// was answered, which only the Outbox reads and writes under its lock.
package deliver
