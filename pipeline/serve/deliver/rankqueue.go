package deliver

import (
	"context"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// Out is one encoded micro-batch on its way to a rank's publisher
// (PublishRank).
type Out struct {
	key     proto.BatchKey
	gen     int
	payload []byte
	samples int  // real samples (counted on mp rank 0)
	last    bool // the step's last micro-batch: the rank's cursor moves on
}

// NewOut is the micro-batch key of generation gen; last marks the step's
// last one.
func NewOut(key proto.BatchKey, gen int, payload []byte, last bool) Out {
	return Out{key: key, gen: gen, payload: payload, last: last}
}

// Key is the micro-batch's key.
func (m Out) Key() proto.BatchKey { return m.key }

// Gen is the rank's generation the micro-batch was built with.
func (m Out) Gen() int { return m.gen }

// Payload is the encoded record.
func (m Out) Payload() []byte { return m.payload }

// Samples is the micro-batch's real (weighted) rows, counted on mp rank 0
// only (QueueOut).
func (m Out) Samples() int { return m.samples }

// Last reports whether it is the step's last micro-batch.
func (m Out) Last() bool { return m.last }

// StepQueue is how many steps a rank's publisher may have queued: building
// and encoding step k+1 overlaps publishing step k, and memory stays bounded.
const StepQueue = 2

// QueueOut counts m's real (weighted) rows when mp is 0, once per
// micro-batch, and queues it for its rank's publisher, or returns ctx's
// error.
func QueueOut(ctx context.Context, q chan<- Out, m Out, rows []proto.Row, mp int) error {
	if mp == 0 {
		for i := range rows {
			if rows[i].Weight > 0 {
				m.samples++
			}
		}
	}
	select {
	case q <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RankParts is what a rank's publisher hands its micro-batches to.
type RankParts interface {
	// Hold hands one micro-batch of rank to the data plane, in plan order;
	// since is when the publisher took it.
	Hold(ctx context.Context, rank int, m Out, since time.Time) error
	// Published counts a micro-batch the plane took.
	Published(bytes, samples int)
}

// PublishRank publishes rank r's queued micro-batches in order until the
// queue is closed (the run ended: publish what is queued) or ctx ends (a
// rewind or a failure: drop it). A step is published only once every rank
// has published the steps before it (Ranks.WaitTurn); after its last
// micro-batch the rank's cursor moves on (Ranks.StepPublished).
func PublishRank(ctx context.Context, p *Publisher, r int, q <-chan Out, ranks *Ranks, parts RankParts) error {
	for m := range q {
		t0 := time.Now()
		if m.key.MicroBatch == 0 { // a step's first batch; the rest of it follows in order
			if err := ranks.WaitTurn(ctx, proto.Pos{Epoch: m.key.Epoch, Step: m.key.Step}); err != nil {
				return err
			}
		}
		if err := parts.Hold(ctx, r, m, t0); err != nil {
			return err
		}
		parts.Published(len(m.payload), m.samples)
		p.Built(m.key)
		if !m.last {
			continue
		}
		ranks.StepPublished(r, proto.Pos{Epoch: m.key.Epoch, Step: m.key.Step}, m.gen)
	}
	return nil
}
