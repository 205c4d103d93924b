package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestWorkerCredentialLeastPrivilege: on a NATS server with the `mmfeed
// creds` identities only, a planner connected as service, a worker holding ONLY the worker
// credential preprocesses every item (features and batches) and two
// trainers holding their rank credentials get every batch exactly once; an
// item of another job, which the worker credential does not cover, is left
// in the queue (never acknowledged or terminated); and the worker
// credential cannot publish trainer subjects, work items, other jobs'
// results, nor delete or purge the work stream, its consumer or the buckets,
// nor read other inboxes.
func TestWorkerCredentialLeastPrivilege(t *testing.T) {
	cfg := testConfig(t, corpus(t, 60), 2, 1, "colocated")
	cfg.Role, cfg.WorkAckWait, cfg.Recalibrate = RolePlanner, 2*time.Second, -1
	conf, ids := writeAuth(t, cfg.Job, 2, 1)
	// A NATS server with the `mmfeed creds` users only (what
	// `nats-server -c auth.conf` runs); the planner connects as service.
	ns, err := natsenv.StartEmbedded(context.Background(), natsenv.Config{Listen: "127.0.0.1:0", ServerConfig: conf, DataDir: t.TempDir(), MaxPayload: 1 << 20},
		&natsenv.Security{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	url := ns.ClientURL()
	svc := ids[natsenv.ServiceUser]
	cfg.NATS = natsenv.Config{URLs: []string{url}, User: svc.User, Password: svc.Password, ReconnectWait: 50 * time.Millisecond}
	r := start(t, cfg)
	asService := []nats.Option{nats.UserInfo(svc.User, svc.Password), slowAuth}
	wk := ids[natsenv.WorkerUser]

	testWorkerForbidden(t, url, wk)

	// An item of job-2, issued before the worker starts: it must survive.
	nc, err := nats.Connect(url, asService...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	foreign, _ := json.Marshal(work.FeatureItem{Kind: "features", ID: "foreign-1", Config: "c", Job: "job-2", Lo: 0, Hi: 1,
		FirstID: "a", LastID: "a", DeadlineMS: 1000})
	if _, err := js.Publish(ctx, work.ItemsSubject("job-2"), foreign); err != nil {
		t.Fatal(err)
	}

	var logs syncBuffer
	wc := work.WorkerConfig{NATS: natsenv.Config{URLs: []string{url}, User: wk.User, Password: wk.Password}, Slots: 2,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	wctx, wcancel := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() { werr <- work.RunWorker(wctx, wc) }()

	// The worker takes job-2's item, is refused its bucket, and leaves it
	// in the queue: taken and left again after foreignNakDelay.
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := strings.Count(logs.String(), "left to other workers\" job=job-2"); n < 2 {
			return errorf("job-2's item refused and left %d times, want 2; log:\n%s", n, logs.String())
		}
		return nil
	})
	st, err := js.Stream(ctx, work.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := st.GetLastMsgForSubject(ctx, work.ItemsSubject("job-2")); err != nil || !bytes.Equal(m.Data, foreign) {
		t.Errorf("job-2's item is gone from the work queue (%v): a worker refused on it lost it", err)
	}

	trs := runTrainersWith(t, ctx, cfg, url, []int{0}, true, func(tr *trainer) {
		id := ids[natsenv.TrainerUser(tr.dp, tr.mp)]
		tr.natsOpts = []nats.Option{nats.UserInfo(id.User, id.Password), slowAuth}
	})
	quarantined := countKeys(t, js, QuarantineBucket(cfg.Job))
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("planner: %v", err)
	}
	wcancel()
	if err := <-werr; err != nil {
		t.Errorf("worker: %v", err)
	}
	for _, l := range strings.Split(logs.String(), "\n") { // refused nothing of its own job
		if strings.Contains(l, "nats refused") && !strings.Contains(l, "job-2") {
			t.Errorf("the worker credential was refused a subject of its own job: %s", l)
		}
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	realOnce(t, trs, 0, ex, quarantined)
	if m, err := st.GetLastMsgForSubject(ctx, work.ItemsSubject("job-2")); err != nil || !bytes.Equal(m.Data, foreign) {
		t.Errorf("job-2's item is gone from the work queue after the run (%v)", err)
	}
}

// testWorkerForbidden checks that the worker credential is refused every
// subject beyond its role.
func testWorkerForbidden(t *testing.T, url string, wk natsenv.Identity) {
	t.Helper()
	var v violations
	nc, err := nats.Connect(url, nats.UserInfo(wk.User, wk.Password), slowAuth,
		nats.CustomInboxPrefix(work.WorkerInboxPrefix), nats.ErrorHandler(v.handler))
	if err != nil {
		t.Fatalf("worker credential: %v", err)
	}
	defer nc.Close()
	obj, kv := "OBJ_"+work.Bucket("job-1"), "KV_"+QuarantineBucket("job-1")
	forbidden := []string{
		"mmfeed.job-1.ack.0.0", "mmfeed.job-1.fetch.1.0", "mmfeed.job-1.ctl.register", "mmfeed.job-1.ctl.done",
		"mmfeed.job-1.ctl.done.0.0", "mmfeed.job-1.ctl.resend.1.0", "mmfeed.job-1.batch.0.0",
		work.ItemsSubject("job-1"), work.ResultSubject("job-2"), work.FeaturesSubject("job-2"),
		"$JS.API.STREAM.DELETE." + work.Stream, "$JS.API.STREAM.PURGE." + work.Stream, "$JS.API.STREAM.UPDATE." + work.Stream,
		"$JS.API.CONSUMER.DELETE." + work.Stream + "." + work.Consumer, "$JS.API.CONSUMER.CREATE." + work.Stream + ".x",
		"$JS.API.STREAM.DELETE." + obj, "$JS.API.STREAM.PURGE." + obj, "$JS.API.STREAM.DELETE." + kv,
		"$JS.API.STREAM.DELETE.OBJ_" + work.FeatureBucket, "$O." + work.Bucket("job-1") + ".M.x",
		"$JS.API.STREAM.INFO.OBJ_" + work.Bucket("job-2"), "$KV." + proto.BucketName("job-1") + ".rank.0.0",
		"$JS.API.STREAM.DELETE." + proto.StreamName("job-1"),
	}
	for _, subj := range forbidden {
		if err := nc.Publish(subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	// What the role needs works: its job's quarantine records, its work bucket.
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if q, err := js.KeyValue(ctx, QuarantineBucket("job-1")); err != nil {
		t.Errorf("worker credential: quarantine bucket: %v", err)
	} else if _, err := q.Create(ctx, "s.d29ya2VyLXRlc3Q", []byte(`{"id":"worker-test"}`)); err != nil {
		t.Errorf("worker credential: quarantine record: %v", err)
	} else if err := q.Delete(ctx, "s.d29ya2VyLXRlc3Q"); err != nil {
		t.Error(err)
	}
	if _, err := js.ObjectStore(ctx, work.Bucket("job-1")); err != nil {
		t.Errorf("worker credential: work bucket: %v", err)
	}
	subs := []string{"_INBOX.>", "_INBOX.mmfeed.job-1.0.0.>", "mmfeed.job-1.batch.>", work.ItemsSubject("job-1")}
	for _, subj := range subs {
		if _, err := nc.SubscribeSync(subj); err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, subj := range append(forbidden, subs...) {
			if !v.has(subj) {
				return errorf("no permissions violation for %s (errors: %s)", subj, v.String())
			}
		}
		return nil
	})
}

// countKeys counts a KV bucket's keys.
func countKeys(t *testing.T, js jetstream.JetStream, bucket string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.Keys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		t.Fatal(err)
	}
	return len(keys)
}
