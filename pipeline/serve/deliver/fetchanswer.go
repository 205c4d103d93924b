package deliver

import (
	"context"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// FetchParts is what answering a fetch needs besides the outbox, the rank
// table and the publisher.
type FetchParts interface {
	// Send sends a held batch to a fetch's reply inbox.
	Send(reply string, it *Item)
	// HandFailed records that the rank table could not record rank's batch
	// as handed: it was not sent.
	HandFailed(rank int, err error)
}

// Fetches answers the core data plane's fetches from the outbox.
type Fetches struct {
	out   *Outbox
	ranks *Ranks
	pub   *Publisher
	parts FetchParts
}

// NewFetches answers fetches from out, handing batches through ranks and
// asking pub for the rewinds that regenerate a batch no longer held.
func NewFetches(out *Outbox, ranks *Ranks, pub *Publisher, parts FetchParts) *Fetches {
	return &Fetches{out: out, ranks: ranks, pub: pub, parts: parts}
}

// Answer answers the fetches of rank for key that w stands for: it
// sends the batch's chunks to the newest one's reply inbox as soon as the
// outbox holds the batch. A batch that was built and is no longer held (the
// rank acknowledged it, then restarted from an older checkpoint; or it was
// purged) is regenerated: the rank is rewound to the batch's step with a
// new generation, and the batch is sent once it is built again. The plan
// and the preprocessing are deterministic, so the regenerated payload is
// byte-identical.
func (f *Fetches) Answer(ctx context.Context, rank int, key proto.BatchKey, waits *FetchWaits, w *Waiter) {
	defer waits.Leave(key, w)
	t := time.NewTimer(FetchWait)
	defer t.Stop()
	rewound, waiting := false, false
	for {
		it, changed := f.out.Lookup(rank, key)
		if it != nil {
			if err := f.ranks.Hand(ctx, rank, key); err != nil {
				// Not sent: a batch the KV bucket does not record as handed is one
				// the next service would refuse the rank's ack of (invariant 6), and
				// the rank would wait for it forever. The rank asks again.
				f.parts.HandFailed(rank, err)
				return
			}
			f.parts.Send(waits.Claim(key, w), it)
			return
		}
		if !waiting {
			waiting = true
			defer f.out.Want(rank, key)()
		}
		if !rewound && f.dropped(rank, key) {
			rewound = true
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := f.pub.Request(rctx, Rewind{Rank: rank, To: proto.Pos{Epoch: key.Epoch, Step: key.Step}, Reason: "fetch of a batch no longer held"})
			cancel()
			if err != nil {
				return
			}
		}
		select {
		case <-changed:
		case <-t.C:
			d := waits.Left(key, w, time.Now())
			if d == 0 {
				return
			}
			t.Reset(d) // a later fetch joined: wait for it
		case <-ctx.Done():
			return
		}
	}
}

// dropped reports whether key was built for rank and is no longer held.
func (f *Fetches) dropped(rank int, key proto.BatchKey) bool {
	built := (proto.Pos{Epoch: key.Epoch, Step: key.Step}).Less(f.ranks.Cursor(rank))
	if !built {
		return false
	}
	it, _ := f.out.Lookup(rank, key)
	return it == nil
}
