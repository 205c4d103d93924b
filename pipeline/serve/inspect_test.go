package serve

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/mmfeed/mmfeed/tokenize"
)

// TestInspectStream: `mmfeed inspect --nats` reads a rank's step from a running
// job (pictures from the vision mp rank, captions from the text mp rank) equal
// to what `mmfeed shard` writes, and takes nothing: the trainers afterwards
// still receive every batch.
func TestInspectStream(t *testing.T) {
	cfg := testConfig(t, corpus(t, 60), 2, 2, "modality")
	cfg.DataPlane = proto.DataPlaneJetStream // inspect --nats reads the job's stream
	r := start(t, cfg)
	checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		if rep := r.s.snapshot(); rep == nil || !rep.Live.Finished {
			return errors.New("not everything published yet")
		}
		return nil
	})
	nc, err := nats.Connect(r.s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	tk, err := tokenize.Open(cfg.Pipeline.Tokenizer)
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got, err := pipeline.ReadStreamStep(ctx, js, cfg.Job, 0, 1, 1, tk)
	if err != nil {
		t.Fatal(err)
	}
	ex := shardExpectation(t, cfg, 0)
	var want []proto.Row
	for mb := range cfg.Pipeline.Plan.MicroBatches {
		want = append(want, ex.rows[[3]int{1, 1, mb}]...)
	}
	if len(got) != len(want) {
		t.Fatalf("%d samples read, the shard has %d", len(got), len(want))
	}
	meta := proto.BatchMeta{DType: proto.DTypeFloat16, Mean: [3]float32(cfg.Pipeline.Image.Mean), Std: [3]float32(cfg.Pipeline.Image.Std)}
	for i, w := range want {
		img, err := pipeline.TensorImage(meta, w)
		if err != nil {
			t.Fatal(err)
		}
		caption, _ := tk.Decode(w.InputIDs)
		if got[i].ID != w.ID || got[i].Caption != caption || got[i].Image == nil || !bytes.Equal(got[i].Image.Pix, img.Pix) {
			t.Errorf("sample %d: %s %q, shard has %s %q (or the pixels differ)", i, got[i].ID, got[i].Caption, w.ID, caption)
		}
	}
	if _, err := pipeline.ReadStreamStep(ctx, js, cfg.Job, 0, 999, 1, tk); !errors.Is(err, pipeline.ErrNoStep) {
		t.Errorf("a step not in the stream: %v, want ErrNoStep", err)
	}
	trs := runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0})
	checkDelivery(t, cfg, trs, 0, ex)
}

// TestInspectCore: on the core data plane (the default), `mmfeed inspect
// --nats` gets a rank's step through viewer fetches, equal to what `mmfeed
// shard` writes, both while the service holds the step and after the
// trainers took it (built again for the viewer); the viewer takes nothing:
// no rank is rewound and the trainers still apply every batch once.
func TestInspectCore(t *testing.T) {
	cfg := testConfig(t, corpus(t, 60), 2, 2, "modality")
	r := start(t, cfg)
	nc, err := nats.Connect(r.s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	tk, err := tokenize.Open(cfg.Pipeline.Tokenizer)
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ex := shardExpectation(t, cfg, 0)
	checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		if k, held := firstHeld(r.s, 1*cfg.MP); !held || k != (proto.BatchKey{Job: cfg.Job, DPRank: 1}) { // the rank's first batch, in plan order
			return errors.New("step 0 not held yet")
		}
		return nil
	})
	checkInspected(t, ctx, cfg, nc, tk, ex, 0) // held in the outbox
	checkInspected(t, ctx, cfg, nc, tk, ex, 1) // held or built for the viewer
	for _, step := range []int{ex.steps, 999} {
		if _, err := pipeline.ReadServiceStep(ctx, nc, cfg.Job, 0, step, 1, tk); !errors.Is(err, pipeline.ErrNoStep) {
			t.Errorf("step %d past the plan: %v, want ErrNoStep", step, err)
		}
	}
	if _, err := pipeline.ReadServiceStep(ctx, nc, "no-such-job", 0, 0, 1, tk); !errors.Is(err, pipeline.ErrNotCore) {
		t.Errorf("a job no service runs: %v, want ErrNotCore", err)
	}
	trs := runTrainersPartial(t, ctx, cfg, r.s.ClientURL(), 2)
	checkInspected(t, ctx, cfg, nc, tk, ex, 1) // taken: built for the viewer
	errc := make(chan error, len(trs))
	for _, tr := range trs {
		go func() { errc <- tr.consume(ctx, 0, -1) }()
	}
	for range trs {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	checkDelivery(t, cfg, trs, 0, ex)
	for i, rs := range r.s.ranks.All() {
		if rs.Gen() != 0 {
			t.Errorf("rank %d at generation %d: a viewer rewound it", i, rs.Gen())
		}
	}
}

// checkInspected reads dp rank 1's step through viewer fetches and compares
// it with the shard's rows (pictures and decoded captions).
func checkInspected(t *testing.T, ctx context.Context, cfg Config, nc *nats.Conn, tk *tokenize.Tokenizer, ex expected, step int) {
	t.Helper()
	got, err := pipeline.ReadServiceStep(ctx, nc, cfg.Job, 0, step, 1, tk)
	if err != nil {
		t.Fatalf("step %d: %v", step, err)
	}
	var want []proto.Row
	for mb := range cfg.Pipeline.Plan.MicroBatches {
		want = append(want, ex.rows[[3]int{step, 1, mb}]...)
	}
	if len(got) != len(want) || len(want) == 0 {
		t.Fatalf("step %d: %d samples read, the shard has %d", step, len(got), len(want))
	}
	meta := proto.BatchMeta{DType: proto.DTypeFloat16, Mean: [3]float32(cfg.Pipeline.Image.Mean), Std: [3]float32(cfg.Pipeline.Image.Std)}
	for i, w := range want {
		img, err := pipeline.TensorImage(meta, w)
		if err != nil {
			t.Fatal(err)
		}
		caption, _ := tk.Decode(w.InputIDs)
		if got[i].ID != w.ID || got[i].Caption != caption || got[i].Image == nil || !bytes.Equal(got[i].Image.Pix, img.Pix) {
			t.Errorf("step %d sample %d: %s %q, shard has %s %q (or the pixels differ)", step, i, got[i].ID, got[i].Caption, w.ID, caption)
		}
	}
}
