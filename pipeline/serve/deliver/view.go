package deliver

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// maxViews bounds the viewer fetches answered at once; one more is refused
// (the viewer asks again later). A viewer fetch that builds its batch
// preprocesses one rank's step.
const maxViews = 2

// viewer answers the viewer fetches of the core plane from its outbox, with
// its chunk size, or with a batch the service builds again for the viewer
// (CorePlaneParts.BuildView).
type viewer struct {
	lay   CoreLayout
	nc    *nats.Conn
	out   *Outbox
	parts CorePlaneParts
	log   *slog.Logger
	views chan struct{} // viewer fetches in flight
}

func newViewer(lay CoreLayout, nc *nats.Conn, out *Outbox, parts CorePlaneParts, log *slog.Logger) *viewer {
	return &viewer{lay: lay, nc: nc, out: out, parts: parts, log: log, views: make(chan struct{}, maxViews)}
}

// startView answers a viewer fetch (FetchRequest.View) of rank on its own
// goroutine, so the rank's own fetches never wait for a viewer.
func (v *viewer) startView(ctx context.Context, rank int, reply string, key proto.BatchKey) {
	select {
	case v.views <- struct{}{}:
	default:
		v.viewError(reply, fmt.Sprintf("%d viewer fetches in flight, ask again later", maxViews), false)
		return
	}
	if !v.parts.Start(func(context.Context) {
		defer func() { <-v.views }()
		v.view(ctx, rank, reply, key)
	}) {
		<-v.views
	}
}

// view sends a copy of key's batch to reply: the outbox's copy while the
// service holds it, otherwise the batch built again from the plan for this
// reply only (the plan and the preprocessing are deterministic, so the bytes
// are the rank's). Nothing of the rank changes: no rewind, no cursor, the
// batch is not marked sent and no ack is awaited.
func (v *viewer) view(ctx context.Context, rank int, reply string, key proto.BatchKey) {
	if key.MicroBatch < 0 || key.MicroBatch >= v.lay.MicroBatches || key.Epoch < v.lay.FirstEpoch || key.Epoch > v.lay.LastEpoch {
		v.viewError(reply, "micro-batch or epoch outside the job", true)
		return
	}
	gen := 0
	payload, sum := []byte(nil), uint32(0)
	if it := v.out.Peek(rank, key); it != nil {
		gen, payload, sum = it.Gen(), it.Payload(), it.Sum()
	} else {
		var outside bool
		var err error
		payload, outside, err = v.parts.BuildView(ctx, rank, key)
		if err != nil {
			v.viewError(reply, err.Error(), outside)
			return
		}
		sum = proto.Checksum(payload)
	}
	if _, err := proto.SendBatch(v.nc, reply, key, gen, payload, sum, v.lay.ChunkSize); err != nil {
		v.log.Warn("send viewer batch", "batch", key.String(), "err", err)
	}
}

// viewError answers a viewer fetch that gets no batch.
func (v *viewer) viewError(reply, reason string, outside bool) {
	if err := v.nc.PublishMsg(proto.ViewError(reply, reason, outside)); err != nil {
		v.log.Warn("viewer fetch reply", "err", err)
	}
}
