package serve

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/crypto/bcrypt"
)

// Identity is one NATS user of a job: a name, its password and the subjects
// it may publish and subscribe to (docs/security.md).
type Identity struct {
	// User is service, worker or trainer-<dp>-<mp>.
	User string
	// Password is random (32 bytes, base64url), given to that user only.
	Password string
	// Permissions are the subjects the user may use.
	Permissions *server.Permissions
}

// Identity names.
const (
	// ServiceUser runs `mmfeed serve` (every role: planner, worker, all):
	// the whole account.
	ServiceUser = "service"
	// WorkerUser runs a preprocessing worker (`--role worker`): builds and
	// publishes batches, reads the job's state, never speaks for a trainer.
	WorkerUser = "worker"
)

// TrainerUser names the identity of trainer rank (dp, mp).
func TrainerUser(dp, mp int) string { return "trainer-" + strconv.Itoa(dp) + "-" + strconv.Itoa(mp) }

// TrainerPermissions lets rank (dp, mp) of job use only its own subjects:
// its rank control subjects (register, feedback, done, resend), its fetch
// and ack subjects (core data plane), its durable consumer's pull and ack
// API, and creating it filtered to its own batch subject (JetStream data
// plane), and replies on its own inbox prefix
// (proto.InboxPrefix). It cannot publish another rank's subjects, the
// job-wide control subjects, or any other JetStream API (stream, consumer
// or KV management, KV writes).
func TrainerPermissions(job string, dp, mp int) (*server.Permissions, error) {
	inbox, err := proto.InboxPrefix(job, dp, mp)
	if err != nil {
		return nil, err
	}
	fetch, _ := proto.FetchSubject(job, dp, mp)
	ack, _ := proto.AckSubject(job, dp, mp)
	batch, _ := proto.BatchSubject(job, dp, mp)
	stream, cons := proto.StreamName(job), proto.ConsumerName(job, dp, mp)
	r := "." + strconv.Itoa(dp) + "." + strconv.Itoa(mp)
	return &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{
			proto.SubjectPrefix + "." + job + ".ctl.*" + r, fetch, ack,
			"$JS.API.CONSUMER.INFO." + stream + "." + cons,
			// Creating or updating its own consumer, filtered to its own batch subject only.
			"$JS.API.CONSUMER.CREATE." + stream + "." + cons + "." + batch,
			"$JS.API.CONSUMER.MSG.NEXT." + stream + "." + cons,
			"$JS.ACK." + stream + "." + cons + ".>",
		}},
		Subscribe: &server.SubjectPermission{Allow: []string{inbox + ".>"}},
	}, nil
}

// WorkerPermissions lets a preprocessing worker of job publish batches
// and answer fetches (the replies go to the trainers' inboxes), take work
// items, and read the job's KV bucket and stream; it cannot publish any
// trainer's control, fetch or ack subject, nor manage streams, consumers or
// buckets. Provisional until the worker role's subjects settle: it is
// written for mmfeed.<job>.work.> as the work-item subjects.
func WorkerPermissions(job string) *server.Permissions {
	p := proto.SubjectPrefix + "." + job + "."
	bucket := "KV_" + proto.BucketName(job)
	return &server.Permissions{
		Publish: &server.SubjectPermission{
			Allow: []string{p + ">", "_INBOX.>",
				"$JS.API.INFO", "$JS.API.STREAM.INFO." + proto.StreamName(job), "$JS.API.STREAM.INFO." + bucket,
				"$JS.API.DIRECT.GET." + bucket + ".>", "$JS.API.STREAM.MSG.GET." + bucket},
			Deny: []string{p + "ctl.>", p + "ack.>", p + "fetch.>"},
		},
		Subscribe: &server.SubjectPermission{Allow: []string{p + "work.>", p + "fetch.>", "_INBOX.>"}},
	}
}

// allPermissions is the service's: everything in the account.
func allPermissions() *server.Permissions {
	all := &server.SubjectPermission{Allow: []string{">"}}
	return &server.Permissions{Publish: all, Subscribe: all}
}

// JobIdentities returns fresh identities for a job of dp × mp trainer
// ranks: the service, the worker and one trainer per rank, each with a new
// random password.
func JobIdentities(job string, dp, mp int) ([]Identity, error) {
	if err := proto.ValidateJob(job); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	if dp < 1 || mp < 1 || dp*mp > 1<<16 {
		return nil, fmt.Errorf("serve: creds for dp %d × mp %d ranks: %w", dp, mp, ErrInvalidConfig)
	}
	ids := []Identity{{User: ServiceUser, Permissions: allPermissions()}, {User: WorkerUser, Permissions: WorkerPermissions(job)}}
	for d := range dp {
		for m := range mp {
			p, err := TrainerPermissions(job, d, m)
			if err != nil {
				return nil, err
			}
			ids = append(ids, Identity{User: TrainerUser(d, m), Permissions: p})
		}
	}
	for i := range ids {
		pw, err := randomSecret()
		if err != nil {
			return nil, err
		}
		ids[i].Password = pw
	}
	return ids, nil
}

func randomSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("serve: random password: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// AuthConfig renders identities as a NATS server configuration file (JSON,
// which the NATS configuration format accepts): an authorization block with
// one user each, the password stored as a bcrypt hash, the permissions
// spelled out. `mmfeed serve --nats-config` loads it, and so does
// `nats-server -c` for an external deployment.
func AuthConfig(ids []Identity) ([]byte, error) {
	type user struct {
		User        string              `json:"user"`
		Password    string              `json:"password"`
		Permissions *server.Permissions `json:"permissions"`
	}
	users := make([]user, len(ids))
	for i, id := range ids {
		h, err := bcrypt.GenerateFromPassword([]byte(id.Password), bcrypt.DefaultCost)
		if err != nil {
			return nil, fmt.Errorf("serve: hash password of %s: %w", id.User, err)
		}
		users[i] = user{User: id.User, Password: string(h), Permissions: id.Permissions}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // the NATS parser knows no \u escapes ('>' in subjects)
	enc.SetIndent("", "  ")
	if err := enc.Encode(map[string]any{"authorization": map[string]any{"users": users}}); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
