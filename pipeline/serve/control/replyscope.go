package control

import (
	"encoding/json"
	"sync/atomic"

	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// workerInboxes are the inbox prefixes a work result may be answered on: a
// worker's own, and the service's for its local workers.
var workerInboxes = work.ResultInboxes()

// Guard answers requests only on the requester's own inbox
// (natsenv.CheckReply): a refused reply publishes nothing, is counted
// (Metrics.ReplyRefused: mmfeed_serve_replies_refused_total{kind,reason},
// and Metrics.Control(kind, "refused")), and logged at most once a second
// per kind. Safe for concurrent use.
type Guard struct {
	job    string
	dp, mp int         // the layout: a rank outside it is nobody's
	strict atomic.Bool // SetStrict, before any handler runs
	met    Metrics
	log    *RateLog
}

// NewGuard returns the reply guard of job with the layout dp × mp; it
// counts refusals in met and logs them to log.
func NewGuard(job string, dp, mp int, met Metrics, log *RateLog) *Guard {
	return &Guard{job: job, dp: dp, mp: mp, met: met, log: log}
}

// SetStrict says whether per-user permissions scope each credential's
// inbox, so that a reply must go to the requester's own (natsenv.CheckReply).
// The service sets it once it knows its NATS security, before any handler
// runs.
func (g *Guard) SetStrict(strict bool) { g.strict.Store(strict) }

// RankInbox returns the inbox prefix of rank (dp, mp).
func (g *Guard) RankInbox(dp, mp int) []string {
	p, err := proto.InboxPrefix(g.job, dp, mp)
	if err != nil {
		return nil
	}
	return []string{p}
}

// Allow reports whether m may be answered for a requester owning the inbox
// prefixes own; a message without a reply subject is allowed (nothing is
// answered). A refusal is counted and logged.
func (g *Guard) Allow(kind string, m *nats.Msg, own ...string) bool {
	if m.Reply == "" {
		return true
	}
	reason := natsenv.CheckReply(m.Reply, g.strict.Load(), own...)
	if reason == "" {
		return true
	}
	g.met.ReplyRefused(kind, reason)
	g.met.Control(kind, "refused")
	g.log.Warn("reply:"+kind, "request refused: its reply subject is outside the requester's inbox",
		"kind", kind, "subject", m.Subject, "reply", work.Truncate(m.Reply, 200), "reason", reason)
	return false
}

// ownOf returns the inbox prefixes of the requester of a control message
// on subj: the rank's on a rank control subject
// (mmfeed.<job>.ctl.<kind>.<dp>.<mp>); on the job-wide one (older clients,
// which no trainer credential may publish) the rank its payload names. When
// that names no rank of the layout (a misconfigured trainer, a malformed
// register: no credential of `mmfeed creds` may send it), any trainer
// inbox of the job (_INBOX.mmfeed.<job>), so that its refusal reaches it.
func (g *Guard) ownOf(subj string, data []byte) []string {
	dp, mp, ok := -1, -1, false
	if _, _, d, m, err := proto.ParseRankControlSubject(subj); err == nil {
		dp, mp, ok = d, m, true
	} else {
		var r struct {
			DP *int `json:"dp_rank"`
			MP *int `json:"mp_rank"`
		}
		if json.Unmarshal(data, &r) == nil && r.DP != nil && r.MP != nil {
			dp, mp, ok = *r.DP, *r.MP, true
		}
	}
	if ok && dp >= 0 && mp >= 0 && dp < g.dp && mp < g.mp {
		return g.RankInbox(dp, mp)
	}
	return []string{"_INBOX." + proto.SubjectPrefix + "." + g.job}
}

// WorkReplyOK returns the reply check of the planner's work-result
// handlers (work.Planner.GuardReplies): a result is taken and answered only
// when its reply is a worker's inbox (work.WorkerInboxPrefix) or, for the
// service's local workers, the service's own.
func (g *Guard) WorkReplyOK(kind string) func(m *nats.Msg) bool {
	return func(m *nats.Msg) bool { return g.Allow(kind, m, workerInboxes...) }
}
