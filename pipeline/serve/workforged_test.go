package serve

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// forgery is one way a forged worker answers a batch item: it changes the
// honest rows (and meta) of the item, or names another config hash.
type forgery struct {
	reason string // the rejection it must get
	config string // the config hash the result names ("": the item's)
	// applies says whether the forgery changes these rows (swapping needs
	// two distinct ids).
	applies func(rows []proto.Row) bool
	forge   func(meta *proto.BatchMeta, rows []proto.Row) []proto.Row
}

func always([]proto.Row) bool { return true }

// forgeries are what a worker credential's holder can send for an item it
// took from the queue; each must be rejected with its reason.
var forgeries = []forgery{
	{reason: work.RejectIDs, applies: always, forge: func(_ *proto.BatchMeta, rows []proto.Row) []proto.Row {
		for i := range rows { // the attack: invented ids, zero pixels, two tokens
			rows[i].ID, rows[i].InputIDs, rows[i].TextTokens = "forged-"+itoa(i), []int32{101, 102}, 2
			clear(rows[i].Pixels)
		}
		return rows
	}},
	{reason: work.RejectOrder, applies: func(rows []proto.Row) bool { return len(rows) > 1 && rows[0].ID != rows[1].ID },
		forge: func(_ *proto.BatchMeta, rows []proto.Row) []proto.Row {
			rows[0], rows[1] = rows[1], rows[0]
			return rows
		}},
	{reason: work.RejectRows, applies: always, forge: func(_ *proto.BatchMeta, rows []proto.Row) []proto.Row {
		return rows[:len(rows)-1] // a missing row
	}},
	{reason: work.RejectRows, applies: always, forge: func(_ *proto.BatchMeta, rows []proto.Row) []proto.Row {
		return append(rows, rows[0]) // an extra row
	}},
	{reason: work.RejectShape, applies: always, forge: func(meta *proto.BatchMeta, rows []proto.Row) []proto.Row {
		meta.Shape = []int{3, 16, 16}
		for i := range rows {
			rows[i].PixelShape, rows[i].Pixels = [3]int32{3, 16, 16}, make([]byte, 3*16*16*proto.DTypeSize(meta.DType))
		}
		return rows
	}},
	{reason: work.RejectDType, applies: always, forge: func(meta *proto.BatchMeta, rows []proto.Row) []proto.Row {
		meta.DType = proto.DTypeFloat32
		for i := range rows {
			rows[i].Pixels = append(rows[i].Pixels, rows[i].Pixels...) // float16 bytes, twice: float32's length
		}
		return rows
	}},
	{reason: work.RejectTokens, applies: always, forge: func(_ *proto.BatchMeta, rows []proto.Row) []proto.Row {
		rows[0].InputIDs = rows[0].InputIDs[:len(rows[0].InputIDs)/2] // text_tokens as planned, fewer ids
		return rows
	}},
	{reason: work.RejectTokens, applies: always, forge: func(_ *proto.BatchMeta, rows []proto.Row) []proto.Row {
		rows[0].TextTokens++ // a consistent lie about the length
		rows[0].InputIDs = append(rows[0].InputIDs, 1000)
		return rows
	}},
	{reason: work.RejectConfig, config: "0123456789abcdef0123456789abcdef", applies: always,
		forge: func(_ *proto.BatchMeta, rows []proto.Row) []proto.Row { return rows }},
}

// TestForgedWorkerResultsRejected plays a worker credential's holder: on a
// bare connection (the embedded server of a planner has no users) it takes
// batch items from the work queue, builds their honest rows with the
// worker's own code, forges them (invented ids with zero pixels and two
// tokens, the right ids in the wrong order, a missing and an extra row,
// another image shape and dtype, wrong token lengths, another config hash)
// and sends them as the item's result, acknowledging the item whatever the
// planner answers. The planner rejects every forgery, counts it by reason
// on /metrics and issues the item again; an honest worker, held until the
// forger is done, builds them, and every rank gets every micro-batch once
// with the rows `mmfeed shard` writes.
func TestForgedWorkerResultsRejected(t *testing.T) {
	cfg := testConfig(t, corpus(t, 60), 2, 1, "colocated")
	cfg.Role, cfg.WorkAckWait, cfg.Recalibrate = RolePlanner, 2*time.Second, -1
	r := start(t, cfg)
	url := r.s.ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	forged := make(chan struct{}) // closed when every forgery was sent
	hold := func(*work.BatchItem) error {
		select {
		case <-forged:
		case <-ctx.Done():
		}
		return nil
	}
	werr := make(chan error, 1)
	wctx, wcancel := context.WithCancel(ctx)
	go func() {
		werr <- work.RunWorker(wctx, work.WorkerConfig{NATS: urlNATS(url), Slots: 1, Logger: testLogger(t).With("worker", "honest"), BeforeSend: hold})
	}()
	ferr := make(chan error, 1)
	go func() {
		defer close(forged)
		ferr <- forgeResults(ctx, t, url, forgeries)
	}()

	trs := runTrainers(t, ctx, cfg, url, []int{0})
	if err := <-ferr; err != nil {
		t.Fatalf("forger: %v", err)
	}
	quarantined := quarantinedInBucket(t, url, cfg.Job)
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("planner: %v", err)
	}
	wcancel()
	if err := <-werr; err != nil {
		t.Errorf("honest worker: %v", err)
	}
	want := map[string]float64{}
	for _, f := range forgeries {
		want[f.reason]++
	}
	total := 0.0
	for reason, n := range want {
		got := labelled(t, r.s, "mmfeed_serve_work_results_rejected_total", reason)
		if got < n {
			t.Errorf("rejected results with reason %s: %v, want at least %v (one per forgery)", reason, got, n)
		}
		total += got
	}
	if re := r.s.work.Counts().Reissued; float64(re) < total {
		t.Errorf("%d items issued again, want one per rejected result (%v)", re, total)
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	realOnce(t, trs, 0, ex, quarantined)
}

// urlNATS is a worker's natsenv.Config for one URL without credentials.
func urlNATS(url string) natsenv.Config {
	return natsenv.Config{URLs: []string{url}, ReconnectWait: 50 * time.Millisecond}
}

// forgeResults takes batch items from the work queue on its own
// connection and answers each with the next forgery that applies to it,
// acknowledging the item, until every forgery was sent; feature items and
// items a forgery does not apply to are left to the honest worker.
func forgeResults(ctx context.Context, t *testing.T, url string, fs []forgery) error {
	nc, err := nats.Connect(url, nats.CustomInboxPrefix(work.WorkerInboxPrefix))
	if err != nil {
		return err
	}
	defer nc.Close()
	aw, err := work.Attach(nc, testLogger(t).With("worker", "forger"), t.TempDir())
	if err != nil {
		return err
	}
	defer aw.Close()
	cons, err := aw.WaitForQueue(ctx)
	if err != nil {
		return err
	}
	var sent atomic.Int32
	for int(sent.Load()) < len(fs) {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		for m := range batch.Messages() {
			var it work.BatchItem
			if json.Unmarshal(m.Data(), &it) != nil || it.Kind != "batch" {
				_ = m.Nak()
				continue
			}
			f := fs[sent.Load()]
			payloads, ok, err := forge(ctx, aw, &it, f)
			if err != nil {
				return err
			}
			if !ok {
				_ = m.Nak()
				continue
			}
			sent.Add(1)
			fi := it
			if f.config != "" {
				fi.Config = f.config
			}
			if err := aw.Send(ctx, &fi, payloads, time.Millisecond); err != nil && !errors.Is(err, work.ErrRejected) {
				t.Logf("forger: %s: the planner answered %v", f.reason, err)
			}
			_ = m.Ack() // as an attacker would: the queue forgets the item
		}
	}
	return nil
}

// forge builds the item's honest payloads and applies f to their rows; ok
// is false when f does not apply to them.
func forge(ctx context.Context, aw *work.Worker, it *work.BatchItem, f forgery) (_ [][]byte, ok bool, _ error) {
	honest, _, err := aw.Build(ctx, it)
	if err != nil {
		return nil, false, err
	}
	out := make([][]byte, len(honest))
	for mp, p := range honest {
		rec, err := proto.DecodeIPC(memory.DefaultAllocator, p)
		if err != nil {
			return nil, false, err
		}
		_, rows, err := proto.ReadRows(rec)
		rec.Release()
		if err != nil {
			return nil, false, err
		}
		if !f.applies(rows) {
			return nil, false, nil
		}
		meta := it.Metas[mp]
		rows = f.forge(&meta, rows)
		frec, err := proto.BuildRecord(memory.DefaultAllocator, meta, rows)
		if err != nil {
			return nil, false, err
		}
		out[mp], err = proto.EncodeIPC(frec)
		frec.Release()
		if err != nil {
			return nil, false, err
		}
	}
	return out, true, nil
}

// familySum sums every series of a counter family on /metrics.
func familySum(t testing.TB, s *Service, name string) float64 {
	t.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.Metric {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestForgedFeatureResultRejected: a worker credential's holder takes the
// feature item and answers it with one entry fewer than its range,
// acknowledging the item. The planner rejects the result (counted with
// reason rows), issues the item again, an honest worker computes it, and
// the job delivers every sample once; before, that one message ended the
// job (ErrState).
func TestForgedFeatureResultRejected(t *testing.T) {
	cfg := testConfig(t, corpus(t, 60), 2, 1, "colocated")
	cfg.Role, cfg.WorkAckWait, cfg.Recalibrate = RolePlanner, 2*time.Second, -1
	r := start(t, cfg)
	url := r.s.ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	nc, err := nats.Connect(url, nats.CustomInboxPrefix(work.WorkerInboxPrefix))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cons, err := js.Consumer(ctx, work.Stream, work.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	var answer string
	for answer == "" {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			var it work.FeatureItem
			if err := json.Unmarshal(m.Data(), &it); err != nil || it.Kind != "features" {
				t.Fatalf("item %s (%v), want the feature item first", m.Data(), err)
			}
			msg := nats.NewMsg(work.FeaturesSubject(cfg.Job))
			msg.Header.Set(work.HdrItem, it.ID)
			msg.Data, _ = json.Marshal(make([]pipeline.EntryFeatures, it.Hi-it.Lo-1))
			reply, err := nc.RequestMsgWithContext(ctx, msg)
			if err != nil {
				t.Fatal(err)
			}
			answer = string(reply.Data)
			_ = m.Ack()
		}
	}
	if !strings.HasPrefix(answer, work.AnswerRejected) {
		t.Errorf("the planner answered %q to a short feature result, want %q...", answer, work.AnswerRejected)
	}
	wctx, wcancel := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() {
		werr <- work.RunWorker(wctx, work.WorkerConfig{NATS: urlNATS(url), Slots: 2, Logger: testLogger(t).With("worker", "honest")})
	}()
	trs := runTrainers(t, ctx, cfg, url, []int{0})
	quarantined := quarantinedInBucket(t, url, cfg.Job)
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("planner: %v", err)
	}
	wcancel()
	if err := <-werr; err != nil {
		t.Errorf("honest worker: %v", err)
	}
	if n := labelled(t, r.s, "mmfeed_serve_work_results_rejected_total", work.RejectRows); n != 1 {
		t.Errorf("rejected results with reason rows: %v, want 1", n)
	}
	ex := shardExpectation(t, cfg, 0)
	checkDelivery(t, cfg, trs, 0, ex)
	realOnce(t, trs, 0, ex, quarantined)
}
