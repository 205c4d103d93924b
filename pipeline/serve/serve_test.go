package serve

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/report"
	"github.com/mmfeed/mmfeed/proto"
)

// TestServeEndToEnd serves two epochs to two dp ranks and checks the
// invariants: every batch of every rank exactly once, in plan order, equal
// steps per rank, rows identical to what `mmfeed shard` writes, every sample
// applied once or quarantined or dropped; and the HTTP endpoints mid-job.
func TestServeEndToEnd(t *testing.T) {
	input := corpus(t, 120)
	cfg := testConfig(t, input, 2, 1, "colocated")
	cfg.Epochs = 2
	cfg.Recalibrate = -1 // epoch 1 keeps the configured model, as `mmfeed shard --epoch 1` does
	cfg.QuarantineDir = t.TempDir()
	cfg.HTTPToken = "s3cret"
	var logs lockedBuffer
	cfg.Logger, cfg.ProgressEvery = slog.New(slog.NewTextHandler(&logs, nil)), 5*time.Millisecond
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	trs := runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0})
	checkHTTP(t, r.s, cfg)
	for _, tr := range trs {
		tr.stepDelay = 20 * time.Millisecond // several progress ticks per epoch
		if err := tr.runEpoch(ctx, 1, -1); err != nil {
			t.Fatal(err)
		}
		tr.crash()
	}
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	for epoch := range 2 {
		ex := shardExpectation(t, cfg, epoch)
		checkDelivery(t, cfg, trs, epoch, ex)
		realOnce(t, trs, epoch, ex, len(quarantinedIDs(t, cfg.QuarantineDir, epoch)))
	}
	if !regexp.MustCompile(`msg=progress .*epoch=1 step=\d+ steps=\d+ percent=\d+ steps_per_s=[\d.]+ eta=\S+`).MatchString(logs.String()) {
		t.Errorf("no progress line with rate and ETA for epoch 1 in the service log:\n%s", logs.String())
	}
}

func checkHTTP(t *testing.T, s *Service, cfg Config) {
	t.Helper()
	get := func(path string, token string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+s.HTTPAddr()+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		path, token string
		code        int
		contains    string
	}{
		{"/healthz", "", 200, "ok"},
		{"/v1/report", "", 401, "unauthorized"},
		{"/v1/report", "wrong", 401, "unauthorized"},
		{"/v1/report", cfg.HTTPToken, 200, `"speedup_vs_random"`},
		{"/metrics", cfg.HTTPToken, 200, "mmfeed_serve_samples_total"},
		{"/metrics", cfg.HTTPToken, 200, `mmfeed_serve_rank_next_step{dp="1",mp="0"}`},
		{"/metrics", cfg.HTTPToken, 200, "mmfeed_serve_step_imbalance_bucket"},
		{"/v1/cost-model", "", 401, "unauthorized"},
		{"/v1/cost-model", cfg.HTTPToken, 200, `"coefficients"`},
		{"/", cfg.HTTPToken, 200, "<svg"},
		{"/nope", cfg.HTTPToken, 404, ""},
	}
	for _, tc := range tests {
		t.Run(strings.TrimPrefix(tc.path, "/")+"/"+tc.token, func(t *testing.T) {
			code, body := get(tc.path, tc.token)
			if code != tc.code || !strings.Contains(body, tc.contains) {
				t.Errorf("GET %s: got %d %.200q, want %d containing %q", tc.path, code, body, tc.code, tc.contains)
			}
		})
	}
	_, body := get("/v1/cost-model", cfg.HTTPToken)
	path := filepath.Join(t.TempDir(), "cost-model.json")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := pipeline.LoadCostModel(path); err != nil {
		t.Errorf("GET /v1/cost-model does not load as --cost-model: %v", err)
	}
	_, body = get("/v1/report", cfg.HTTPToken)
	var rep struct {
		Steps int `json:"steps"`
		Live  report.Live
	}
	if err := json.Unmarshal([]byte(body), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Live.StepsPublished < rep.Steps || len(rep.Live.Steps) == 0 {
		t.Errorf("live report: %d steps published, %d listed, want ≥ the epoch's %d", rep.Live.StepsPublished, len(rep.Live.Steps), rep.Steps)
	}
	st := rep.Live.Steps[0]
	if len(st.PredictedCost) != cfg.Pipeline.Plan.DP || st.MeasuredSeconds[0] <= 0 || st.Imbalance < 1 {
		t.Errorf("live step %+v: want dp predicted costs, a measured time, imbalance ≥ 1", st)
	}
	if rep.Live.Throughput.Samples == 0 || rep.Live.Throughput.BytesPerSecond <= 0 {
		t.Errorf("throughput %+v: want samples and bytes", rep.Live.Throughput)
	}
	if rep.Live.Ranks[1].NextStep == 0 && rep.Live.Ranks[1].NextEpoch == 0 {
		t.Errorf("rank 1 status %+v: the trainer finished epoch 0", rep.Live.Ranks[1])
	}
	var raw struct {
		Live struct{ Ranks []map[string]any }
	}
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"rank", "next_epoch", "next_step", "published_epoch", "published_step", "generation"} {
		if _, ok := raw.Live.Ranks[0][key]; !ok {
			t.Errorf("rank status %v lacks %q", raw.Live.Ranks[0], key)
		}
	}
	for _, method := range []string{"POST", "DELETE"} {
		req, _ := http.NewRequest(method, "http://"+s.HTTPAddr()+"/v1/report", nil)
		req.Header.Set("Authorization", "Bearer "+cfg.HTTPToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s /v1/report: got %d, want 405 (read-only)", method, resp.StatusCode)
		}
	}
}

// TestServeModalityChunked serves mp = 2 with modality placement through a
// server limited to 1 MB max_payload, with float32 pixels large enough that
// every vision batch is chunked: the vision rank gets pixels only, the text
// rank tokens only, both the same ids in the same order.
func TestServeModalityChunked(t *testing.T) {
	input := corpus(t, 40)
	cfg := testConfig(t, input, 2, 2, "modality")
	cfg.NATS.MaxPayload = 1 << 20
	cfg.Pipeline.Image.Size, cfg.Pipeline.Image.DType = 160, "float32" // 300 KiB a sample, 4 a micro-batch
	cfg.Pipeline.Plan.GlobalBatch = 16
	cfg.QuarantineDir = t.TempDir()
	cfg.Epochs, cfg.Recalibrate = 2, -1
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Each rank registers for epoch 1 on the connection and consumer it read
	// epoch 0 with, holding prefetched chunks: the service must leave them be.
	trs := runTrainersConn(t, ctx, cfg, r.s.ClientURL(), []int{0, 1}, false)
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	for epoch := range 2 {
		ex := shardExpectation(t, cfg, epoch)
		checkDelivery(t, cfg, trs, epoch, ex)
		realOnce(t, trs, epoch, ex, len(quarantinedIDs(t, cfg.QuarantineDir, epoch)))
	}
	if got := counter(t, r.s, "mmfeed_serve_rewinds_total"); got != 0 {
		t.Errorf("%v rewinds: nothing was lost, nothing needs republishing", got)
	}
	st := r.s.Stats()
	if st.Chunks <= st.Batches {
		t.Errorf("%d chunks for %d batches (%d bytes): want vision batches over 1 MB split", st.Chunks, st.Batches, st.Bytes)
	}
	for _, tr := range trs {
		for k, rows := range tr.applied {
			for _, row := range rows {
				if (tr.mp == 0) != (len(row.Pixels) > 0) || (tr.mp == 1) != (len(row.InputIDs) > 0 || row.Weight == 0) {
					t.Fatalf("%v row %s: pixels %d bytes, %d ids on mp rank %d", k, row.ID, len(row.Pixels), len(row.InputIDs), tr.mp)
				}
			}
		}
	}
}

// TestRegisterRefusesMismatch checks the refusals: layout, placement, rank
// range, job, epoch range, malformed JSON.
func TestRegisterRefusesMismatch(t *testing.T) {
	cfg := testConfig(t, corpus(t, 40), 2, 1, "colocated")
	cfg.WaitForTrainers = true
	r := start(t, cfg)
	tr := newTrainer(t, cfg, r.s.ClientURL(), 0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tr.connect(ctx); err != nil {
		t.Fatal(err)
	}
	defer tr.crash()
	good := proto.Register{Job: cfg.Job, DPRank: 0, MPRank: 0, DP: 2, MP: 1, Placement: "colocated"}
	tests := []struct {
		name string
		edit func(*proto.Register)
		want string
	}{
		{"ok", func(*proto.Register) {}, ""},
		{"dp", func(r *proto.Register) { r.DP = 4 }, "trainer layout dp=4 mp=1 (world 4) does not match job layout dp=2 mp=1 (world 2)"},
		{"placement", func(r *proto.Register) { r.Placement = "modality"; r.MP = 2 }, "does not match job layout"},
		{"rank", func(r *proto.Register) { r.DPRank = 2 }, "dp_rank 2 out of range [0,2)"},
		{"job", func(r *proto.Register) { r.Job = "other" }, `job "other", this service runs "job-1"`},
		{"epoch", func(r *proto.Register) { r.Epoch = 3 }, "epoch 3 outside the job's epochs [0, 0]"},
		{"resume", func(r *proto.Register) { r.ResumeStep = 1000 }, "resume_step 1000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := good
			tc.edit(&reg)
			rep, err := registerWith(ctx, tr.nc, cfg.Job, reg)
			if err != nil {
				t.Fatal(err)
			}
			if rep.DP != 2 || rep.MP != 1 || rep.Placement != "colocated" || rep.Retry {
				t.Errorf("got layout dp=%d mp=%d %q retry=%v, want the job's dp=2 mp=1 colocated in every reply, no retry",
					rep.DP, rep.MP, rep.Placement, rep.Retry)
			}
			if tc.want == "" {
				if !rep.OK || rep.Steps == 0 || rep.PlanHash == "" || rep.Consumer != "mmfeed_job-1_0_0" || rep.Modality != proto.ModalityAll {
					t.Errorf("got %+v, want ok with steps, plan hash, consumer mmfeed_job-1_0_0, modality all", rep)
				}
				if rep.VocabSize != 30522 { // bert-base-uncased, the tests' tokenizer
					t.Errorf("got vocab size %d in the register reply, want the tokenizer's 30522", rep.VocabSize)
				}
				return
			}
			if rep.OK || !strings.Contains(rep.Error, tc.want) {
				t.Errorf("got ok=%v error %q, want refusal containing %q", rep.OK, rep.Error, tc.want)
			}
		})
	}
	if got := counter(t, r.s, "mmfeed_serve_rewinds_total"); got != 0 {
		t.Errorf("%v rewinds: registering at step 0 while nothing was acknowledged needs none", got)
	}
	t.Run("malformed", func(t *testing.T) {
		subj, _ := proto.ControlSubject(cfg.Job, proto.CtlRegister)
		msg, err := tr.nc.RequestWithContext(ctx, subj, []byte(`{"job":"job-1","extra":1}`))
		if err != nil {
			t.Fatal(err)
		}
		var rep proto.RegisterReply
		if err := json.Unmarshal(msg.Data, &rep); err != nil || rep.OK || !strings.Contains(rep.Error, "unknown field") {
			t.Errorf("got %s (%v), want a refusal naming the unknown field", msg.Data, err)
		}
	})
}
