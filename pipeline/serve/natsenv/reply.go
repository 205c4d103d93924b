package natsenv

import "strings"

// ServiceInboxPrefix is the reply inbox prefix of the service's own
// connection. No request is answered there (a forged reply subject must not
// inject an answer into the service's own pending requests), except a work
// result of the service's local workers, which share its connection.
const ServiceInboxPrefix = "_INBOX.mmfeedservice"

// Why a reply subject is refused: the reason label of
// mmfeed_serve_replies_refused_total (serve).
const (
	ReplyNotInbox = "not_inbox" // not a literal subject under _INBOX. ($KV.…, $JS.API.…, a batch subject)
	ReplyService  = "service"   // under the service's own inbox prefix
	ReplyForeign  = "foreign"   // under another mmfeed identity's inbox prefix (another rank, the worker, the viewer)
	ReplyNotOwn   = "not_own"   // with per-user authentication: outside the requester's own inbox prefix
)

// CheckReply returns "" when a request whose requester owns the inbox
// prefixes own (none: a job-wide subject, whose requester is not known) may
// be answered on reply, else why not. A reply must be a literal subject
// under "_INBOX."; one under an mmfeed identity's prefix ("_INBOX.mmfeed…":
// the service's, a trainer rank's, the worker's, the viewer's) only under
// own; with strict (the service's NATS server has users, so each
// credential may subscribe to its own prefix only) only under own when own
// is given. The service answers with its own permissions: a reply anywhere
// else would be a write the requester may not make itself.
func CheckReply(reply string, strict bool, own ...string) string {
	if !literalInbox(reply) {
		return ReplyNotInbox
	}
	for _, p := range own {
		if under(reply, p) {
			return ""
		}
	}
	switch {
	case under(reply, ServiceInboxPrefix):
		return ReplyService
	case strings.HasPrefix(reply, "_INBOX.mmfeed"):
		return ReplyForeign
	case strict && len(own) > 0:
		return ReplyNotOwn
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

// ReplyPrefix returns a request's reply subject without its last token: the
// connection's inbox prefix with nats.go and nats-py muxed requests, so a
// trainer registering again for its next epoch on the same connection is
// recognised (and its unacknowledged chunks left alone).
func ReplyPrefix(reply string) string {
	if i := strings.LastIndexByte(reply, '.'); i > 0 {
		return reply[:i]
	}
	return ""
}
