package serve

import (
	"context"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/mmfeed/mmfeed/pipeline/serve/control"
	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestForgedAcksEndNothing plays issue 20's forged ack: before anything is
// delivered, an attacker (rank 0's own credential with authentication on,
// or a bare connection) acknowledges the last micro-batch of the epoch and
// the batches of step 0 that are built and held but were never fetched,
// then reports the epoch done and its last step trained. The service
// refuses the acks and holds the done back (counted on /metrics), no rank moves, nothing
// is dropped from the outbox, no KV position is written, and the trainers
// then receive every sample exactly once before the job ends.
func TestForgedAcksEndNothing(t *testing.T) {
	t.Cleanup(control.SetDoneAckWait(100 * time.Millisecond))
	for _, auth := range []bool{true, false} {
		name := map[bool]string{true: "creds", false: "bare"}[auth]
		t.Run(name, func(t *testing.T) { testForgedAcks(t, auth) })
	}
}

func testForgedAcks(t *testing.T, auth bool) {
	cfg := testConfig(t, corpus(t, 60), 2, 1, "colocated")
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
	checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		for rank := range 2 {
			if _, held := firstHeld(r.s, rank); !held {
				return errorf("nothing held for rank %d yet", rank)
			}
		}
		return nil
	})
	steps := r.s.epochs.Steps(0)
	opts := []nats.Option{slowAuth}
	ranks := []int{0, 1}
	if auth { // rank 0's own credential: it may publish its own ack subject only
		inbox, _ := proto.InboxPrefix(cfg.Job, 0, 0)
		id := ids[natsenv.TrainerUser(0, 0)]
		opts, ranks = append(opts, nats.UserInfo(id.User, id.Password), nats.CustomInboxPrefix(inbox)), []int{0}
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	mbs := cfg.Pipeline.Plan.MicroBatches
	forged := 0
	for _, dp := range ranks {
		subj, _ := proto.AckSubject(cfg.Job, dp, 0)
		for _, k := range []proto.BatchKey{{Step: steps - 1, MicroBatch: mbs - 1}, {Step: 0, MicroBatch: mbs - 1}, {Step: 0, MicroBatch: 0}} {
			k.Job, k.DPRank = cfg.Job, dp
			b, _ := proto.EncodeControl(proto.AckRequest(proto.NewFetchRequest(k)))
			if err := nc.Publish(subj, b); err != nil { // a reply would be refused before the ack is looked at
				t.Fatal(err)
			}
			forged++
		}
		// And a done and a feedback past everything: held back at the first unacknowledged step.
		done, _ := proto.RankControlSubject(cfg.Job, proto.CtlDone, dp, 0)
		fb, _ := proto.RankControlSubject(cfg.Job, proto.CtlFeedback, dp, 0)
		for subj, v := range map[string]any{done: proto.Done{Job: cfg.Job, DPRank: dp, Steps: steps},
			fb: proto.Feedback{Job: cfg.Job, Step: steps - 1, DPRank: dp, ComputeSeconds: 1}} {
			b, _ := proto.EncodeControl(v)
			if err := nc.Publish(subj, b); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := acksRefused(r.s); n != float64(forged) {
			return errorf("%v acks refused, want %d", n, forged)
		}
		if n := testutil.ToFloat64(r.s.met.control.WithLabelValues(proto.CtlDone, "unacknowledged")); n < float64(len(ranks)) {
			return errorf("%v dones held back, want %d", n, len(ranks))
		}
		return nil
	})
	for rank, rs := range r.s.ranks.All() {
		if rs.Next() != (proto.Pos{Epoch: 0, Step: 0}) {
			t.Errorf("rank %d: next needed step %+v after forged acks, want epoch 0 step 0", rank, rs.Next())
		}
		if k, held := firstHeld(r.s, rank); !held || k.Step != 0 || k.MicroBatch != 0 {
			t.Errorf("rank %d: first held batch %v (held %v) after forged acks, want step 0 micro-batch 0", rank, k, held)
		}
	}
	// Whatever the position writer holds, written now: no rank past its first step.
	if err := r.s.ranks.FlushPositions(context.Background()); err != nil {
		t.Fatal(err)
	}
	var rec deliver.RanksRecord
	if _, err := r.s.st.getJSON(context.Background(), deliver.KeyPositions, &rec); err != nil {
		t.Fatal(err)
	}
	for rank, s := range rec.Ranks {
		if s != nil {
			t.Errorf("rank %d: KV position %v written by forged acks", rank, *s)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	trainEpoch0Once(t, ctx, r, cfg, url, ids)
}

// acksRefused is mmfeed_serve_control_messages_total{kind="ack",result="refused"}.
func acksRefused(s *Service) float64 {
	return testutil.ToFloat64(s.met.control.WithLabelValues("ack", "refused"))
}

// TestAckOfBatchHandedBeforeRestart: a batch a service sent before it
// restarted is still "handed" to the restarted one (rank.<dp>.<mp>.handed in
// the KV bucket), so the rank's ack of it moves its position; a batch never
// sent is not.
func TestAckOfBatchHandedBeforeRestart(t *testing.T) {
	cfg := testConfig(t, corpus(t, 48), 1, 1, "colocated")
	cfg.Recalibrate, cfg.WaitForTrainers = -1, true
	cfg.NATS.Listen = "127.0.0.1:" + itoa(freePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	registered := func(r *running) {
		tr := newTrainer(t, cfg, r.s.ClientURL(), 0, 0)
		if err := tr.connect(ctx); err != nil {
			t.Fatal(err)
		}
		defer tr.crash()
		if rep, err := tr.register(ctx, 0, 0); err != nil || !rep.OK {
			t.Fatalf("register: %+v, %v", rep, err)
		}
	}
	r := start(t, cfg)
	registered(r)
	rank := newRawRank(t, r.s.ClientURL(), cfg.Job, 0)
	rank.fetch(0, 0, 0)
	rank.fetch(0, 0, 1)
	rank.nc.Close()
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r2 := start(t, cfg)
	rank = newRawRank(t, r2.s.ClientURL(), cfg.Job, 0)
	rank.ack(0, 0, 1) // answered: handed by the first service
	if next := r2.s.ranks.Next(0); next != (proto.Pos{Epoch: 0, Step: 1}) {
		t.Errorf("next needed step %+v after the ack of step 0, want step 1", next)
	}
	k := proto.BatchKey{Job: cfg.Job, Step: 1, MicroBatch: 1}
	b, _ := proto.EncodeControl(proto.AckRequest(proto.NewFetchRequest(k)))
	subj, _ := proto.AckSubject(cfg.Job, 0, 0)
	if _, err := rank.nc.Request(subj, b, time.Second); err == nil {
		t.Errorf("the ack of step 1, never sent, was answered")
	}
	if next := r2.s.ranks.Next(0); next != (proto.Pos{Epoch: 0, Step: 1}) {
		t.Errorf("next needed step %+v after the ack of an unsent step, want step 1", next)
	}
}

// TestForgedJetStreamAckDropsNothing guards what the JetStream data plane
// relies on: a rank's position there is bounded by the first chunk its
// work-queue subject still stores (control.unacked), and the server ignores
// an ack of a chunk it has not delivered, so forged acks (a trainer
// credential may publish $JS.ACK for its own consumer) remove nothing.
func TestForgedJetStreamAckDropsNothing(t *testing.T) {
	srv := testnats.Server(t, testnats.Options{})
	nc, _ := testnats.Connect(t, srv.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Retention: jetstream.WorkQueuePolicy})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "s.a"})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := js.Publish(ctx, "s.a", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	for _, seq := range []string{"5", "3", "2"} { // $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>
		if err := nc.Publish("$JS.ACK.S.C.1."+seq+"."+seq+".1700000000000000000.0", []byte("+ACK")); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil { // confirmed: the acks before it were processed too
			t.Fatal(err)
		}
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 4 || info.State.FirstSeq != 2 {
		t.Errorf("stream holds %d chunks from sequence %d after forged acks of 2, 3 and 5 and a real ack of 1, want 4 from 2",
			info.State.Msgs, info.State.FirstSeq)
	}
}
