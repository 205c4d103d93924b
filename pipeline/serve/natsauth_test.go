package serve

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/control"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// slowAuth gives a connection time for the server's bcrypt check of its
// password on a loaded machine (nats.go's default is 2 s).
var slowAuth = nats.Timeout(20 * time.Second)

// writeAuth writes a job's identities as a NATS server configuration file
// and returns them by user name.
func writeAuth(t testing.TB, job string, dp, mp int) (string, map[string]natsenv.Identity) {
	t.Helper()
	ids, err := natsenv.JobIdentities(job, dp, mp)
	if err != nil {
		t.Fatal(err)
	}
	conf, err := natsenv.AuthConfig(ids)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "auth.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	byUser := map[string]natsenv.Identity{}
	for _, id := range ids {
		byUser[id.User] = id
	}
	return path, byUser
}

// violations collects a connection's asynchronous permission errors.
type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.errs = append(v.errs, err.Error())
}

// String lists the errors collected so far.
func (v *violations) String() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return strings.Join(v.errs, "; ")
}

func (v *violations) has(subj string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, e := range v.errs {
		if strings.Contains(e, "ermissions") && strings.Contains(e, `"`+subj+`"`) {
			return true
		}
	}
	return false
}

// TestNATSAuthRankPermissions: with `mmfeed creds` identities loaded into
// the embedded server, rank 0's credential cannot publish rank 1's acks,
// fetches or resends, the job-wide done, or any JetStream API beyond its own
// consumer (stream delete, KV writes, rank 1's consumer), nor read other
// inboxes or batch subjects; a rank-subject message naming another rank is
// refused; anonymous connections are refused; and trainers holding only
// their own rank's credentials still receive every batch exactly once.
func TestNATSAuthRankPermissions(t *testing.T) {
	t.Cleanup(control.SetDoneAckWait(100 * time.Millisecond))
	for _, plane := range []string{proto.DataPlaneCore, proto.DataPlaneJetStream} {
		t.Run(plane, func(t *testing.T) { testRankPermissions(t, plane) })
	}
}

func testRankPermissions(t *testing.T, plane string) {
	cfg := testConfig(t, corpus(t, 60), 2, 1, "colocated")
	cfg.DataPlane = plane
	cfg.Recalibrate = -1
	cfg.QuarantineDir = t.TempDir()
	conf, ids := writeAuth(t, cfg.Job, 2, 1)
	cfg.NATS.ServerConfig = conf
	r := start(t, cfg)
	url := r.s.ClientURL()

	if nc, err := nats.Connect(url); err == nil {
		nc.Close()
		t.Fatal("anonymous connection accepted by a server with users")
	}
	watch, err := nats.Connect(url, nats.UserInfo(natsenv.ServiceUser, ids[natsenv.ServiceUser].Password), slowAuth)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	seen := make(chan string, 64)
	mine := func(m *nats.Msg) { // what this test publishes, not the service's own traffic
		if bytes.Contains(m.Data, []byte(`"steps":99`)) {
			seen <- m.Subject
		}
	}
	wsub, err := watch.Subscribe("mmfeed.job-1.>", mine)
	if err != nil {
		t.Fatal(err)
	}
	defer wsub.Unsubscribe()
	watchJS, err := watch.Subscribe("$JS.API.STREAM.DELETE.>", mine)
	if err != nil {
		t.Fatal(err)
	}
	defer watchJS.Unsubscribe()
	_ = watch.Flush()

	var v violations
	inbox, _ := proto.InboxPrefix(cfg.Job, 0, 0)
	r0 := ids[natsenv.TrainerUser(0, 0)]
	nc, err := nats.Connect(url, nats.UserInfo(r0.User, r0.Password), slowAuth, nats.CustomInboxPrefix(inbox), nats.ErrorHandler(v.handler))
	if err != nil {
		t.Fatalf("rank 0 with its credential: %v", err)
	}
	defer nc.Close()
	forbidden := []string{
		"mmfeed.job-1.ack.1.0", "mmfeed.job-1.fetch.1.0", "mmfeed.job-1.ctl.resend.1.0", "mmfeed.job-1.ctl.done.1.0",
		"mmfeed.job-1.ctl.done", "mmfeed.job-1.ctl.resend", "mmfeed.job-1.ctl.register", "mmfeed.job-1.batch.0.0",
		"$JS.API.STREAM.DELETE.MMFEED_job-1", "$JS.API.STREAM.PURGE.MMFEED_job-1", "$KV.mmfeed_job-1.rank.0.0",
		"$JS.API.CONSUMER.MSG.NEXT.MMFEED_job-1.mmfeed_job-1_1_0", "$JS.API.CONSUMER.CREATE.MMFEED_job-1.mmfeed_job-1_0_0.mmfeed.job-1.batch.1.0",
		"$JS.API.CONSUMER.DELETE.MMFEED_job-1.mmfeed_job-1_0_0",
	}
	for _, subj := range forbidden {
		if err := nc.Publish(subj, []byte(`{"job":"job-1","epoch":0,"dp_rank":1,"mp_rank":0,"steps":99}`)); err != nil {
			t.Fatal(err)
		}
	}
	for _, subj := range []string{"_INBOX.>", "mmfeed.job-1.batch.>", "_INBOX.mmfeed.job-1.1.0.>"} {
		if _, err := nc.SubscribeSync(subj); err != nil {
			t.Fatal(err)
		}
	}
	// Rank 0's own subject with a payload naming rank 1: delivered, then refused by the service.
	b, _ := proto.EncodeControl(proto.Done{Job: cfg.Job, Epoch: 0, DPRank: 1, Steps: 99})
	if err := nc.Publish("mmfeed.job-1.ctl.done.0.0", b); err != nil {
		t.Fatal(err)
	}
	select { // one publisher's messages arrive in order: what passed would have arrived first
	case got := <-seen:
		if got != "mmfeed.job-1.ctl.done.0.0" {
			t.Errorf("watcher saw %q from rank 0's credential before its own done", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("rank 0's own done subject never arrived")
	}
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, subj := range append(forbidden, "_INBOX.>", "mmfeed.job-1.batch.>", "_INBOX.mmfeed.job-1.1.0.>") {
			if !v.has(subj) {
				return errorf("no permissions violation for %s (errors: %s)", subj, v.String())
			}
		}
		if n := labelled(t, r.s, "mmfeed_serve_control_messages_total", "refused"); n < 1 {
			return errorf("the done naming rank 1 on rank 0's subject not refused")
		}
		return nil
	})
	nc.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	trainEpoch0Once(t, ctx, r, cfg, url, ids)
}

// trainEpoch0Once runs the job's trainers through epoch 0, each with its own
// rank's credential when ids is not nil, waits for the service to end and
// checks that every sample was applied exactly once or quarantined.
func trainEpoch0Once(t *testing.T, ctx context.Context, r *running, cfg Config, url string, ids map[string]natsenv.Identity) {
	t.Helper()
	trs := runTrainersWith(t, ctx, cfg, url, []int{0}, true, func(tr *trainer) {
		if ids != nil {
			id := ids[natsenv.TrainerUser(tr.dp, tr.mp)]
			tr.natsOpts = []nats.Option{nats.UserInfo(id.User, id.Password), slowAuth}
		}
	})
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	realOnce(t, trs, 0, ex, len(quarantinedIDs(t, cfg.QuarantineDir, 0)))
}

// TestNATSAuthViewer: the viewer credential of `mmfeed creds` reads a
// running job (a rank's step through viewer fetches on the core data plane,
// the stream's info and the state bucket on both planes) and changes
// nothing: every control, fetch and ack subject, KV write and JetStream
// management API is refused by the server, a non-viewer fetch on a view
// subject is refused by the service, and the trainers still apply every
// batch once.
func TestNATSAuthViewer(t *testing.T) {
	t.Cleanup(control.SetDoneAckWait(100 * time.Millisecond))
	for _, plane := range []string{proto.DataPlaneCore, proto.DataPlaneJetStream} {
		t.Run(plane, func(t *testing.T) { testViewer(t, plane) })
	}
}

func testViewer(t *testing.T, plane string) {
	cfg := testConfig(t, corpus(t, 60), 2, 1, "colocated")
	cfg.DataPlane = plane
	cfg.Recalibrate = -1
	cfg.QuarantineDir = t.TempDir()
	conf, ids := writeAuth(t, cfg.Job, 2, 1)
	cfg.NATS.ServerConfig = conf
	r := start(t, cfg)
	url := r.s.ClientURL()
	var v violations
	viewer := ids[natsenv.ViewerUser]
	nc, err := nats.Connect(url, nats.UserInfo(viewer.User, viewer.Password), slowAuth,
		nats.CustomInboxPrefix(natsenv.ViewerInboxPrefix), nats.ErrorHandler(v.handler))
	if err != nil {
		t.Fatalf("viewer with its credential: %v", err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		kv, err := js.KeyValue(ctx, proto.BucketName(cfg.Job))
		if err != nil {
			return err
		}
		_, err = kv.Get(ctx, epochs.InfoKey(0))
		return err
	})
	if plane == proto.DataPlaneCore {
		// The epoch's KV info is written when it is planned, a moment before the
		// publisher makes it the epoch being served (what a view may read): ask
		// until it is.
		checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
			samples, err := pipeline.ReadServiceStep(ctx, nc, cfg.Job, 0, 0, 1, nil)
			if err == nil && len(samples) == 0 {
				err = errorf("no samples")
			}
			if err != nil {
				return errorf("viewer fetch of dp rank 1 step 0: %v", err)
			}
			return nil
		})
		// A fetch that is not a viewer's, on the view subject: refused, nothing answered.
		b, _ := proto.EncodeControl(proto.FetchRequest{Job: cfg.Job, DPRank: 1})
		if _, err := nc.Request("mmfeed.job-1.view.1.0", b, time.Second); !errors.Is(err, nats.ErrTimeout) {
			t.Errorf("a non-viewer fetch on the view subject: %v, want no answer", err)
		}
	} else if _, err := js.Stream(ctx, proto.StreamName(cfg.Job)); err != nil {
		t.Errorf("viewer reading the stream's info: %v", err)
	}
	forbidden := []string{
		"mmfeed.job-1.fetch.0.0", "mmfeed.job-1.ack.0.0", "mmfeed.job-1.ctl.resend.0.0", "mmfeed.job-1.ctl.done.0.0",
		"mmfeed.job-1.ctl.register.0.0", "mmfeed.job-1.ctl.feedback.0.0", "mmfeed.job-1.ctl.done",
		"$JS.API.STREAM.DELETE.MMFEED_job-1", "$JS.API.STREAM.PURGE.KV_mmfeed_job-1", "$KV.mmfeed_job-1.rank.0.0",
		"$JS.API.CONSUMER.CREATE.MMFEED_job-1", "$JS.API.CONSUMER.MSG.NEXT.MMFEED_job-1.mmfeed_job-1_0_0",
		"$JS.API.STREAM.MSG.DELETE.MMFEED_job-1",
	}
	for _, subj := range forbidden {
		if err := nc.Publish(subj, []byte(`{"job":"job-1","epoch":0,"dp_rank":0,"mp_rank":0,"steps":99}`)); err != nil {
			t.Fatal(err)
		}
	}
	for _, subj := range []string{"_INBOX.>", "mmfeed.job-1.batch.>", "_INBOX.mmfeed.job-1.0.0.>"} {
		if _, err := nc.SubscribeSync(subj); err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, subj := range append(forbidden, "_INBOX.>", "mmfeed.job-1.batch.>", "_INBOX.mmfeed.job-1.0.0.>") {
			if !v.has(subj) {
				return errorf("no permissions violation for %s (errors: %s)", subj, v.String())
			}
		}
		return nil
	})
	if plane == proto.DataPlaneCore {
		if n := labelled(t, r.s, "mmfeed_serve_control_messages_total", "refused"); n < 1 {
			t.Errorf("the non-viewer fetch on the view subject not refused")
		}
	}
	trainEpoch0Once(t, ctx, r, cfg, url, ids)
}

// TestHTTPListenNeedsToken: an HTTP address on a non-loopback host without
// a token is refused unless Insecure.
func TestHTTPListenNeedsToken(t *testing.T) {
	for _, tc := range []struct {
		http, token string
		insecure    bool
		want        error
	}{
		{"127.0.0.1:0", "", false, nil}, {"[::1]:0", "", false, nil}, {":8080", "", false, ErrInsecure},
		{"0.0.0.0:8080", "", false, ErrInsecure}, {"0.0.0.0:8080", "secret", false, nil}, {"0.0.0.0:8080", "", true, nil},
	} {
		c := testConfig(t, "unused", 1, 1, "colocated")
		c.HTTP, c.HTTPToken, c.Insecure = tc.http, tc.token, tc.insecure
		if err := c.Validate(); errors.Is(err, ErrInsecure) != (tc.want != nil) { // other fields may fail too

			t.Errorf("http %q token %q insecure %v: got %v, want %v", tc.http, tc.token, tc.insecure, err, tc.want)
		}
	}
}
