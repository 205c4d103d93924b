package serve

import (
	"encoding/json"
	"strings"
	"sync/atomic"

	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// ServiceInboxPrefix is the reply inbox prefix of the service's own
// connection. No request is answered there (a forged reply subject must not
// inject an answer into the service's own pending requests), except a work
// result of the service's local workers, which share its connection.
const ServiceInboxPrefix = "_INBOX.mmfeedservice"

// Why a reply subject is refused: the reason label of
// mmfeed_serve_replies_refused_total.
const (
	replyNotInbox = "not_inbox" // not a literal subject under _INBOX. ($KV.…, $JS.API.…, a batch subject)
	replyService  = "service"   // under the service's own inbox prefix
	replyForeign  = "foreign"   // under another mmfeed identity's inbox prefix (another rank, the worker, the viewer)
	replyNotOwn   = "not_own"   // with per-user authentication: outside the requester's own inbox prefix
)

// workerInboxes are the inbox prefixes a work result may be answered on: a
// worker's own, and the service's for its local workers.
var workerInboxes = []string{work.WorkerInboxPrefix, ServiceInboxPrefix}

// checkReply returns "" when a request whose requester owns the inbox
// prefixes own (none: a job-wide subject, whose requester is not known) may
// be answered on reply, else why not. A reply must be a literal subject
// under "_INBOX."; one under an mmfeed identity's prefix ("_INBOX.mmfeed…":
// the service's, a trainer rank's, the worker's, the viewer's) only under
// own; with strict (the service's NATS server has users, so each
// credential may subscribe to its own prefix only) only under own when own
// is given. The service answers with its own permissions: a reply anywhere
// else would be a write the requester may not make itself.
func checkReply(reply string, strict bool, own ...string) string {
	if !literalInbox(reply) {
		return replyNotInbox
	}
	for _, p := range own {
		if under(reply, p) {
			return ""
		}
	}
	switch {
	case under(reply, ServiceInboxPrefix):
		return replyService
	case strings.HasPrefix(reply, "_INBOX.mmfeed"):
		return replyForeign
	case strict && len(own) > 0:
		return replyNotOwn
	}
	return ""
}

// literalInbox reports whether subj is a literal subject (no wildcard, no
// empty token, no whitespace) with at least one token after "_INBOX".
func literalInbox(subj string) bool {
	if !strings.HasPrefix(subj, "_INBOX.") || len(subj) > 1024 {
		return false
	}
	for _, tok := range strings.Split(subj, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
			return false
		}
	}
	return true
}

// under reports whether subj is strictly below prefix, token by token.
func under(subj, prefix string) bool {
	return len(subj) > len(prefix)+1 && strings.HasPrefix(subj, prefix) && subj[len(prefix)] == '.'
}

// replyGuard answers requests only on the requester's own inbox
// (checkReply): a refused reply publishes nothing, is counted in
// mmfeed_serve_replies_refused_total{kind,reason} and
// mmfeed_serve_control_messages_total{kind,result="refused"}, and logged at
// most once a second per kind. Safe for concurrent use.
type replyGuard struct {
	job    string
	dp, mp int         // the layout: a rank outside it is nobody's
	strict atomic.Bool // set by startNATS before any handler runs
	met    *metrics
	log    *rateLog
}

// rankInbox returns the inbox prefix of rank (dp, mp).
func (g *replyGuard) rankInbox(dp, mp int) []string {
	p, err := proto.InboxPrefix(g.job, dp, mp)
	if err != nil {
		return nil
	}
	return []string{p}
}

// allow reports whether m may be answered for a requester owning the inbox
// prefixes own; a message without a reply subject is allowed (nothing is
// answered). A refusal is counted and logged.
func (g *replyGuard) allow(kind string, m *nats.Msg, own ...string) bool {
	if m.Reply == "" {
		return true
	}
	reason := checkReply(m.Reply, g.strict.Load(), own...)
	if reason == "" {
		return true
	}
	g.met.repliesRefused.WithLabelValues(kind, reason).Inc()
	g.met.control.WithLabelValues(kind, "refused").Inc()
	g.log.warn("reply:"+kind, "request refused: its reply subject is outside the requester's inbox",
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
func (g *replyGuard) ownOf(subj string, data []byte) []string {
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
		return g.rankInbox(dp, mp)
	}
	return []string{"_INBOX." + proto.SubjectPrefix + "." + g.job}
}

// workReplyOK returns the reply check of the planner's work-result
// handlers (workPlanner.guardReplies): a result is taken and answered only
// when its reply is a worker's inbox (work.WorkerInboxPrefix) or, for the
// service's local workers, the service's own.
func (s *Service) workReplyOK(kind string) func(m *nats.Msg) bool {
	return func(m *nats.Msg) bool { return s.replies.allow(kind, m, workerInboxes...) }
}
