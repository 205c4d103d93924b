package natsenv

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
	// WorkerUser runs a preprocessing worker (`--role worker`): takes work
	// items, reads the job's work bucket, sends the job's results to its
	// planner, never speaks for a trainer (WorkerPermissions).
	WorkerUser = "worker"
	// ViewerUser reads a running job without taking part in it (`mmfeed
	// inspect`, dashboards): viewer fetches, the job's stream and buckets,
	// read only (ViewerPermissions).
	ViewerUser = "viewer"
)

// ViewerInboxPrefix is the reply inbox prefix of a viewer's connection
// (`mmfeed inspect` uses it with every credential): the viewer credential
// may subscribe there only.
const ViewerInboxPrefix = "_INBOX.mmfeedviewer"

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

// WorkerPermissions lets a preprocessing worker (`mmfeed serve --role
// worker`) of job do what work.RunWorker does for that job's items and nothing
// else:
//   - take items from the shared work queue: the workers consumer's info,
//     pull (MSG.NEXT) and acknowledgements (ack, nak, in-progress, term);
//   - read the job's work object store (WorkBucket: configs, tokenizer
//     files): its stream info, its metadata by direct get, and an ordered
//     consumer of its chunks (create, flow control, delete);
//   - add quarantine records to the job's quarantine bucket (its stream info,
//     its $KV subjects, direct gets for Create's check);
//   - send the job's results (mmfeedwork.<job>.result and .features);
//   - receive replies on WorkerInboxPrefix only.
//
// It cannot publish work items, any mmfeed.<job>.> subject (trainer
// control, fetch, ack, batches), any other job's results or buckets, the
// feature cache (the planner's), nor create, delete or purge streams,
// buckets or the workers consumer. A worker takes items of every job from
// the shared consumer; an item of a job its credential does not cover is
// refused by the server and left in the queue for another worker
// (worker.refusedJob, docs/security.md).
func WorkerPermissions(job string) *server.Permissions {
	obj := "OBJ_" + WorkBucket(job)
	q := QuarantineBucket(job)
	kv := "KV_" + q
	queue := WorkStream + "." + WorkConsumer
	return &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{
			"$JS.API.CONSUMER.INFO." + queue, "$JS.API.CONSUMER.MSG.NEXT." + queue, "$JS.ACK." + queue + ".>",
			// The work bucket: ObjectStore, GetInfo, and Get's ordered consumer (flow controlled, deleted when read).
			"$JS.API.STREAM.INFO." + obj, "$JS.API.DIRECT.GET." + obj + ".>",
			"$JS.API.CONSUMER.CREATE." + obj + ".>", "$JS.API.CONSUMER.DELETE." + obj + ".>", "$JS.FC." + obj + ".>",
			// The quarantine bucket: KeyValue, and Create (its check of a deleted key reads it).
			"$JS.API.STREAM.INFO." + kv, "$JS.API.DIRECT.GET." + kv + ".>", "$KV." + q + ".>",
			WorkResultSubject(job), WorkFeaturesSubject(job),
		}},
		Subscribe: &server.SubjectPermission{Allow: []string{WorkerInboxPrefix + ".>"}},
	}
}

// ViewerPermissions lets a viewer of job read it and change nothing:
//   - viewer fetches on every rank's view subject (proto.ViewSubject), which
//     the service answers with a copy and nothing else (no rewind, no
//     cursor, no ack awaited);
//   - the job's stream (JetStream data plane) and its state and quarantine
//     buckets: stream info and message gets (direct or through the API);
//   - replies on ViewerInboxPrefix only.
//
// It cannot publish any control subject (register, feedback, done, resend),
// fetch or ack subject, KV write, or any other JetStream API (consumers,
// stream or bucket management, purges), nor read a trainer's inbox or the
// batch subjects.
func ViewerPermissions(job string) *server.Permissions {
	pub := []string{proto.SubjectPrefix + "." + job + ".view.*.*"}
	for _, st := range []string{proto.StreamName(job), "KV_" + proto.BucketName(job), "KV_" + QuarantineBucket(job)} {
		pub = append(pub, "$JS.API.STREAM.INFO."+st, "$JS.API.STREAM.MSG.GET."+st, "$JS.API.DIRECT.GET."+st,
			"$JS.API.DIRECT.GET."+st+".>")
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: pub},
		Subscribe: &server.SubjectPermission{Allow: []string{ViewerInboxPrefix + ".>"}},
	}
}

// allPermissions is the service's: everything in the account.
func allPermissions() *server.Permissions {
	all := &server.SubjectPermission{Allow: []string{">"}}
	return &server.Permissions{Publish: all, Subscribe: all}
}

// JobIdentities returns fresh identities for a job of dp × mp trainer
// ranks: the service, the worker, the viewer and one trainer per rank, each with a new
// random password.
func JobIdentities(job string, dp, mp int) ([]Identity, error) {
	if err := proto.ValidateJob(job); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	if dp < 1 || mp < 1 || dp*mp > 1<<16 {
		return nil, fmt.Errorf("serve: creds for dp %d × mp %d ranks: %w", dp, mp, ErrInvalidConfig)
	}
	ids := []Identity{{User: ServiceUser, Permissions: allPermissions()}, {User: WorkerUser, Permissions: WorkerPermissions(job)},
		{User: ViewerUser, Permissions: ViewerPermissions(job)}}
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
		pw, err := RandomSecret()
		if err != nil {
			return nil, err
		}
		ids[i].Password = pw
	}
	return ids, nil
}

func RandomSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("serve: random password: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// PasswordHashCost is the bcrypt cost of the hashes AuthConfig writes. The
// server checks a password at every connect; tests built with the race
// detector lower it (race_test.go), where a cost-10 check at a load of 10
// takes over the 2 s after which the server sends its first PING, which
// nats.go refuses during CONNECT ("expected 'PONG', got 'PING'",
// nats-server#1174).
var PasswordHashCost = bcrypt.DefaultCost

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
		h, err := bcrypt.GenerateFromPassword([]byte(id.Password), PasswordHashCost)
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
