package proto

import (
	"fmt"
	"strconv"
	"strings"
)

// SubjectPrefix is the first token of every mmfeed subject.
const SubjectPrefix = "mmfeed"

// MaxJobLen bounds job names so that every derived name (subjects, stream,
// consumer, bucket, message ids, headers) stays short.
const MaxJobLen = 64

// Control message kinds: the last token of mmfeed.<job>.ctl.<kind>.
const (
	// CtlRegister: request/reply, trainer rank → service (Register →
	// RegisterReply).
	CtlRegister = "register"
	// CtlFeedback: trainer rank → service, one Feedback per step.
	CtlFeedback = "feedback"
	// CtlDone: trainer rank → service, a Done when the rank finished an epoch.
	CtlDone = "done"
	// CtlResend: trainer rank → service, a Resend for a batch it could not
	// use (checksum error, missing chunk).
	CtlResend = "resend"
)

// ValidateJob checks a job name: 1..64 characters from [A-Za-z0-9_-]. That is
// stricter than a NATS subject token (no '.', '*', '>' or whitespace) so the
// same name is also valid in stream, consumer and KV bucket names.
func ValidateJob(job string) error {
	if job == "" || len(job) > MaxJobLen {
		return fmt.Errorf("proto: job name %q: length %d not in [1,%d]: %w", job, len(job), MaxJobLen, ErrInvalidName)
	}
	for i := 0; i < len(job); i++ {
		if !nameByte(job[i]) {
			return fmt.Errorf("proto: job name %q: byte %d %q not in [A-Za-z0-9_-]: %w", job, i, job[i], ErrInvalidName)
		}
	}
	return nil
}

func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// BatchSubject returns mmfeed.<job>.batch.<dp>.<mp>.
func BatchSubject(job string, dp, mp int) (string, error) {
	if err := ValidateJob(job); err != nil {
		return "", err
	}
	if dp < 0 || mp < 0 {
		return "", fmt.Errorf("proto: rank dp=%d mp=%d negative: %w", dp, mp, ErrInvalidName)
	}
	return SubjectPrefix + "." + job + ".batch." + strconv.Itoa(dp) + "." + strconv.Itoa(mp), nil
}

// BatchWildcard returns mmfeed.<job>.batch.>, the subjects of a job's stream.
func BatchWildcard(job string) (string, error) {
	if err := ValidateJob(job); err != nil {
		return "", err
	}
	return SubjectPrefix + "." + job + ".batch.>", nil
}

// ParseBatchSubject splits mmfeed.<job>.batch.<dp>.<mp>.
func ParseBatchSubject(subj string) (job string, dp, mp int, err error) {
	t := strings.Split(subj, ".")
	if len(t) != 5 || t[0] != SubjectPrefix || t[2] != "batch" {
		return "", 0, 0, fmt.Errorf("proto: subject %q is not mmfeed.<job>.batch.<dp>.<mp>: %w", subj, ErrInvalidName)
	}
	if err := ValidateJob(t[1]); err != nil {
		return "", 0, 0, err
	}
	if dp, err = parseNonNeg(t[3]); err != nil {
		return "", 0, 0, fmt.Errorf("proto: subject %q dp: %w", subj, ErrInvalidName)
	}
	if mp, err = parseNonNeg(t[4]); err != nil {
		return "", 0, 0, fmt.Errorf("proto: subject %q mp: %w", subj, ErrInvalidName)
	}
	return t[1], dp, mp, nil
}

// ControlSubject returns mmfeed.<job>.ctl.<kind>; kind is one of the Ctl
// constants or another [a-z0-9_-] token.
func ControlSubject(job, kind string) (string, error) {
	if err := ValidateJob(job); err != nil {
		return "", err
	}
	if kind == "" || strings.ContainsFunc(kind, func(r rune) bool { return r > 127 || !nameByte(byte(r)) }) {
		return "", fmt.Errorf("proto: control kind %q: %w", kind, ErrInvalidName)
	}
	return SubjectPrefix + "." + job + ".ctl." + kind, nil
}

// RankControlSubject returns mmfeed.<job>.ctl.<kind>.<dp>.<mp>: the control
// subject of rank (dp, mp). A service accepts a rank's control messages here
// only when the rank in the payload equals the rank in the subject, so
// subject permissions (docs/security.md) can confine a trainer's
// credentials to its own rank. The job-wide ControlSubject stays accepted
// for clients that predate rank subjects.
func RankControlSubject(job, kind string, dp, mp int) (string, error) {
	subj, err := ControlSubject(job, kind)
	if err != nil {
		return "", err
	}
	if dp < 0 || mp < 0 {
		return "", fmt.Errorf("proto: rank dp=%d mp=%d negative: %w", dp, mp, ErrInvalidName)
	}
	return subj + "." + strconv.Itoa(dp) + "." + strconv.Itoa(mp), nil
}

// ParseRankControlSubject splits mmfeed.<job>.ctl.<kind>.<dp>.<mp>.
func ParseRankControlSubject(subj string) (job, kind string, dp, mp int, err error) {
	t := strings.Split(subj, ".")
	if len(t) != 6 || t[0] != SubjectPrefix || t[2] != "ctl" {
		return "", "", 0, 0, fmt.Errorf("proto: subject %q is not mmfeed.<job>.ctl.<kind>.<dp>.<mp>: %w", subj, ErrInvalidName)
	}
	if _, err := ControlSubject(t[1], t[3]); err != nil {
		return "", "", 0, 0, err
	}
	dp, err1 := parseNonNeg(t[4])
	mp, err2 := parseNonNeg(t[5])
	if err1 != nil || err2 != nil {
		return "", "", 0, 0, fmt.Errorf("proto: subject %q rank: %w", subj, ErrInvalidName)
	}
	return t[1], t[3], dp, mp, nil
}

// InboxPrefix returns _INBOX.mmfeed.<job>.<dp>.<mp>: the reply inbox prefix
// of rank (dp, mp)'s connection (nats.go CustomInboxPrefix, nats-py
// inbox_prefix), so that its credentials may subscribe to its own replies
// only.
func InboxPrefix(job string, dp, mp int) (string, error) {
	subj, err := rankSubject(job, "x", dp, mp)
	if err != nil {
		return "", err
	}
	return "_INBOX." + strings.Replace(subj, ".x.", ".", 1), nil
}

// StreamName returns the JetStream stream of a job: MMFEED_<job> (the job
// name verbatim, so distinct jobs never share a stream).
func StreamName(job string) string { return "MMFEED_" + job }

// ConsumerName returns the durable consumer of rank (dp, mp):
// mmfeed_<job>_<dp>_<mp>.
func ConsumerName(job string, dp, mp int) string {
	return "mmfeed_" + job + "_" + strconv.Itoa(dp) + "_" + strconv.Itoa(mp)
}

// BucketName returns the KV bucket of a job: mmfeed_<job>.
func BucketName(job string) string { return "mmfeed_" + job }

// parseNonNeg parses a canonical non-negative decimal int (no sign, no
// leading zeros, fits in int32).
func parseNonNeg(s string) (int, error) {
	if s == "" || len(s) > 10 || (len(s) > 1 && s[0] == '0') {
		return 0, ErrInvalidName
	}
	v, err := strconv.ParseUint(s, 10, 31)
	if err != nil {
		return 0, ErrInvalidName
	}
	return int(v), nil
}
