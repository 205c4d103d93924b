package serve

import (
	"context"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/control"
	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// replyAttack is one request an attacker sends with a reply subject that
// is not its own inbox.
type replyAttack struct {
	subject string
	body    any
	reply   string
}

// TestRepliesGoToTheRequesterOnly plays the confused-deputy attack of
// issue 20: a trainer credential (or, without authentication, a bare
// connection) and the viewer send register, resend, fetch, ack and view
// requests whose reply subject is the job's KV config, another rank's KV
// position, the JetStream API that deletes the feature cache or the job's
// KV bucket, another rank's inbox or the service's own. The service answers
// none of them (counted on /metrics), the KV config and rank keys and the
// streams are unchanged, and the trainers then receive every sample once.
func TestRepliesGoToTheRequesterOnly(t *testing.T) {
	t.Cleanup(control.SetDoneAckWait(100 * time.Millisecond))
	for _, tc := range []struct {
		name  string
		plane string
		auth  bool
	}{
		{"core/creds", proto.DataPlaneCore, true},
		{"core/bare", proto.DataPlaneCore, false},
		{"jetstream/creds", proto.DataPlaneJetStream, true},
	} {
		t.Run(tc.name, func(t *testing.T) { testRepliesScoped(t, tc.plane, tc.auth) })
	}
}

func testRepliesScoped(t *testing.T, plane string, auth bool) {
	cfg := testConfig(t, corpus(t, 60), 2, 1, "colocated")
	cfg.DataPlane = plane
	cfg.Recalibrate = -1
	cfg.QuarantineDir = t.TempDir()
	var ids map[string]natsenv.Identity
	if auth {
		var conf string
		conf, ids = writeAuth(t, cfg.Job, 2, 1)
		cfg.NATS.ServerConfig = conf
	}
	r := start(t, cfg)
	url := r.s.ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	as := func(user string, inbox string) *nats.Conn {
		opts := []nats.Option{slowAuth}
		if auth {
			opts = append(opts, nats.UserInfo(user, ids[user].Password), nats.CustomInboxPrefix(inbox))
		}
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			t.Fatalf("connect as %s: %v", user, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	svc := as(natsenv.ServiceUser, "_INBOX.test")
	js, err := jetstream.New(svc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, proto.BucketName(cfg.Job))
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		_, err := kv.Get(ctx, epochs.InfoKey(0))
		return err
	})
	keys := []string{"config", deliver.KeyPositions, deliver.RankGenKey(0, 0), deliver.RankGenKey(1, 0)}
	before := kvRevisions(t, ctx, kv, keys)

	rank0, _ := proto.InboxPrefix(cfg.Job, 0, 0)
	rank1, _ := proto.InboxPrefix(cfg.Job, 1, 0)
	targets := []string{"$KV." + proto.BucketName(cfg.Job) + ".config", "$KV." + proto.BucketName(cfg.Job) + "." + deliver.KeyPositions,
		"$JS.API.STREAM.DELETE.OBJ_" + work.FeatureBucket, "$JS.API.STREAM.DELETE.KV_" + proto.BucketName(cfg.Job),
		"$JS.API.STREAM.DELETE." + proto.StreamName(cfg.Job), rank1 + ".stolen", ServiceInboxPrefix + ".x.1"}
	if auth {
		targets = append(targets, "_INBOX.someone.1") // with users: only the rank's own inbox
	}
	key := proto.BatchKey{Job: cfg.Job, Epoch: 0, Step: 0, MicroBatch: 0}
	var trainerAttacks, viewerAttacks []replyAttack
	for _, reply := range targets {
		reg, _ := proto.RankControlSubject(cfg.Job, proto.CtlRegister, 0, 0)
		res, _ := proto.RankControlSubject(cfg.Job, proto.CtlResend, 0, 0)
		trainerAttacks = append(trainerAttacks,
			replyAttack{reg, proto.Register{Job: cfg.Job, DP: 2, MP: 1, Placement: "colocated"}, reply},
			replyAttack{res, proto.Resend{Job: cfg.Job, Reason: "forged"}, reply})
		if plane == proto.DataPlaneCore {
			fetch, _ := proto.FetchSubject(cfg.Job, 0, 0)
			ack, _ := proto.AckSubject(cfg.Job, 0, 0)
			view, _ := proto.ViewSubject(cfg.Job, 0, 0)
			trainerAttacks = append(trainerAttacks,
				replyAttack{fetch, proto.NewFetchRequest(key), reply},
				replyAttack{ack, proto.AckRequest(proto.NewFetchRequest(key)), reply})
			vreq := proto.NewFetchRequest(key)
			vreq.View = true
			viewerAttacks = append(viewerAttacks, replyAttack{view, vreq, reply})
		}
	}
	send := func(nc *nats.Conn, attacks []replyAttack) {
		for _, a := range attacks {
			b, err := proto.EncodeControl(a.body)
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.PublishRequest(a.subject, a.reply, b); err != nil {
				t.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	send(as(natsenv.TrainerUser(0, 0), rank0), trainerAttacks)
	send(as(natsenv.ViewerUser, natsenv.ViewerInboxPrefix), viewerAttacks)
	want := float64(len(trainerAttacks) + len(viewerAttacks))
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := sumCounter(t, r.s, "mmfeed_serve_replies_refused_total"); n != want {
			return errorf("%v replies refused, want %v", n, want)
		}
		return nil
	})
	if n := labelled(t, r.s, "mmfeed_serve_control_messages_total", "refused"); n < want {
		t.Errorf("%v control messages counted refused, want at least %v", n, want)
	}
	if after := kvRevisions(t, ctx, kv, keys); !equalMaps(before, after) {
		t.Errorf("KV keys changed by the attack: before %v, after %v", before, after)
	}
	streams := []string{"OBJ_" + work.FeatureBucket, "KV_" + proto.BucketName(cfg.Job)}
	if plane == proto.DataPlaneJetStream {
		streams = append(streams, proto.StreamName(cfg.Job))
	}
	for _, st := range streams {
		if _, err := js.Stream(ctx, st); err != nil {
			t.Errorf("stream %s after the attack: %v", st, err)
		}
	}

	trainEpoch0Once(t, ctx, r, cfg, url, ids)
}

// kvRevisions returns the revision of each key (0: absent).
func kvRevisions(t testing.TB, ctx context.Context, kv jetstream.KeyValue, keys []string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		switch {
		case err == nil:
			out[k] = e.Revision()
		case err == jetstream.ErrKeyNotFound:
			out[k] = 0
		default:
			t.Fatalf("kv get %s: %v", k, err)
		}
	}
	return out
}

func equalMaps(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// sumCounter returns the sum of every series of a counter family.
func sumCounter(t testing.TB, s *Service, name string) float64 {
	t.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.Metric {
				sum += m.Counter.GetValue()
			}
		}
	}
	return sum
}
