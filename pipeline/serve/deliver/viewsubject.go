package deliver

import (
	"context"
	"fmt"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// subscribeViews answers viewer fetches on each rank's view subject
// (proto.ViewSubject, core data plane; one subscription per rank, so a
// viewer asking for a rank outside the layout gets no responders, as on the
// fetch subjects): a request there must be a viewer fetch (View set) of the
// subject's own rank, with a reply subject, and is answered like one on the
// fetch subject (startView, at most maxViews at once). Nothing else is done
// for it, so the viewer credential, which may publish there only, cannot
// move a rank.
func (v *viewer) subscribeViews(ctx context.Context) ([]*nats.Subscription, error) {
	var subs []*nats.Subscription
	for r := range v.lay.Ranks {
		subj, err := proto.ViewSubject(v.lay.Job, r/v.lay.MP, r%v.lay.MP)
		if err == nil {
			var sub *nats.Subscription
			sub, err = v.nc.Subscribe(subj, func(m *nats.Msg) { v.handleView(ctx, r, m) })
			subs = append(subs, sub)
		}
		if err != nil {
			for _, x := range subs {
				if x != nil {
					_ = x.Unsubscribe()
				}
			}
			return nil, fmt.Errorf("serve: subscribe %s: %w", subj, err)
		}
	}
	return subs, nil
}

func (v *viewer) handleView(ctx context.Context, rank int, m *nats.Msg) {
	var req proto.FetchRequest
	err := proto.DecodeControl(m.Data, &req)
	if err == nil {
		var r int
		if r, err = v.parts.CheckRank(req.Job, req.DPRank, req.MPRank); err == nil && (r != rank || !req.View || m.Reply == "") {
			err = fmt.Errorf("serve: %s: not a viewer fetch of this subject's rank with a reply: %w", m.Subject, proto.ErrControl)
		}
	}
	if err != nil {
		v.parts.BadControl("view", err)
		return
	}
	if !v.parts.AllowView(m) {
		return
	}
	v.startView(ctx, rank, m.Reply, req.Key())
}
