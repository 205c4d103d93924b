package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/reportcheck"
	"github.com/mmfeed/mmfeed/pipeline/serve/report"
)

// rankSeconds is the test trainers' step time of dp rank d: rank 1 is three
// times as slow as rank 0, so every step's measured imbalance is 1.5.
func rankSeconds(d int) float64 { return 0.1 * float64(1+2*d) }

// readRunReport reads one --report-out JSON file.
func readRunReport(t *testing.T, path string) (report.RunReport, []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rr report.RunReport
	if err := json.Unmarshal(b, &rr); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return rr, b
}

// checkEpochMeasured checks an epoch the trainers finished: every step
// trained and measured, the ranks' times as the trainers reported them, the
// measured imbalance beside the predicted one, the epoch's quarantine.
func checkEpochMeasured(t *testing.T, em report.EpochMeasured, steps, quarantined int) {
	t.Helper()
	if em.Steps != steps || em.StepsTrained != steps || em.StepsMeasured != steps || em.StepsPublished != steps {
		t.Errorf("epoch %d: steps %d, trained %d, measured %d, published %d; want %d each", em.Epoch, em.Steps, em.StepsTrained, em.StepsMeasured, em.StepsPublished, steps)
	}
	if len(em.Ranks) != 2 {
		t.Fatalf("epoch %d: %d ranks, want 2", em.Epoch, len(em.Ranks))
	}
	for d, rm := range em.Ranks {
		want := rankSeconds(d)
		if rm.DP != d || rm.Steps != steps || math.Abs(rm.MeanSeconds-want) > 1e-9 || math.Abs(rm.MaxSeconds-want) > 1e-9 ||
			math.Abs(rm.TotalSeconds-want*float64(steps)) > 1e-6 || math.Abs(rm.MeanDataWaitSeconds-0.001) > 1e-9 {
			t.Errorf("epoch %d rank %d: %+v, want %d steps of %.1f s, data wait 0.001 s", em.Epoch, d, rm, steps, want)
		}
	}
	if m := em.MeasuredImbalance; m.Steps != steps || math.Abs(m.Mean-1.5) > 1e-9 || math.Abs(m.Max-1.5) > 1e-9 {
		t.Errorf("epoch %d: measured imbalance %+v, want %d steps at 1.5", em.Epoch, m, steps)
	}
	if p := em.PredictedImbalance; p.Steps != steps || p.Mean < 1 || p.Max < p.Mean || p.Max > 2 {
		t.Errorf("epoch %d: predicted imbalance %+v, want %d steps, 1 ≤ mean ≤ max ≤ 2 (two ranks)", em.Epoch, p, steps)
	}
	if pl, pr := em.PlannedImbalance, em.PredictedImbalance; pl.Steps != pr.Steps || math.Abs(pl.Mean-pr.Mean) > 1e-9 || pl.Max != pr.Max {
		t.Errorf("epoch %d: planned %+v differs from predicted %+v over the same (every) step", em.Epoch, em.PlannedImbalance, em.PredictedImbalance)
	}
	var q int64
	for _, n := range em.Quarantined {
		q += n
	}
	if q != int64(quarantined) || quarantined == 0 {
		t.Errorf("epoch %d: %d quarantined (%v), want the quarantine file's %d (> 0)", em.Epoch, q, em.Quarantined, quarantined)
	}
}

// checkRunHTML checks that path is a report page whose measured numbers
// equal the JSON's.
func checkRunHTML(t *testing.T, path string, js []byte) {
	t.Helper()
	page, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := reportcheck.Compare(string(page), js)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	vals := reportcheck.Values(string(page))
	for _, key := range []string{"run.epochs.0.ranks.1.mean_seconds", "run.epochs.0.measured_imbalance.mean", "run.epochs.0.predicted_imbalance.mean",
		"run.steps_trained", "live.steps_trained", "live.steps_published", "speedup_vs_random"} {
		if _, ok := vals[key]; !ok {
			t.Errorf("%s shows no %s (%d numbers checked)", path, key, n)
		}
	}
}

// getLive reads /v1/report's live section and the HTML live fragment.
func getLive(t *testing.T, s *Service) (report.Live, string) {
	t.Helper()
	get := func(path string) []byte {
		resp, err := http.Get("http://" + s.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return b
	}
	var lr report.LiveReport
	if err := json.Unmarshal(get("/v1/report"), &lr); err != nil {
		t.Fatal(err)
	}
	return lr.Live, string(get("/?part=live"))
}

// TestReportOutEndToEnd serves two epochs with --report-out: after epoch 0
// its files hold the measured figures while epoch 1 is published and not yet
// trained (the live report and page say so); after the job both epochs'
// files and the latest (reason exit) are there.
func TestReportOutEndToEnd(t *testing.T) {
	defer func(d time.Duration) { reportEvery = d }(reportEvery)
	reportEvery = 20 * time.Millisecond
	cfg := testConfig(t, corpus(t, 120), 2, 1, "colocated")
	cfg.Epochs = 2
	cfg.QuarantineDir = t.TempDir()
	cfg.ReportOut = filepath.Join(t.TempDir(), "run")
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	setup := func(tr *trainer) {
		tr.computeSeconds = func(int, int) float64 { return rankSeconds(tr.dp) }
		if tr.dp == 1 { // epoch 0's last step times land well after its acks: the file waits for them
			tr.feedbackDelay = func(e, step int) time.Duration {
				if e == 0 && step == r.s.epochs.Steps(0)-1 {
					return 300 * time.Millisecond
				}
				return 0
			}
		}
	}
	trs := runTrainersWith(t, ctx, cfg, r.s.ClientURL(), []int{0}, true, setup)
	steps := r.s.epochs.Steps(0)

	e0 := filepath.Join(cfg.ReportOut, "report-e0.json")
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if _, err := os.Stat(e0); err != nil {
			return err
		}
		return nil
	})
	rr, js := readRunReport(t, e0)
	if rr.Run.Reason != reasonEpochEnd || rr.Run.Epoch != 0 || rr.Report == nil || rr.Report.Epoch != 0 || len(rr.Run.Epochs) < 1 {
		t.Fatalf("report-e0.json: reason %q epoch %d, report %v, %d epochs; want epoch_end of epoch 0 with its comparison", rr.Run.Reason, rr.Run.Epoch, rr.Report != nil, len(rr.Run.Epochs))
	}
	checkEpochMeasured(t, rr.Run.Epochs[0], steps, len(quarantinedIDs(t, cfg.QuarantineDir, 0)))
	if tt := rr.Report.TextTruncation; tt == nil || tt.MaxLength != 128 || tt.Captions == 0 {
		t.Errorf("report-e0.json text_truncation %+v, want the captions counted at max length 128", tt)
	}
	if rr.Run.StepsTrained != steps || rr.Run.FinishedTraining {
		t.Errorf("run: %d steps trained (finished %v), want epoch 0's %d, not finished", rr.Run.StepsTrained, rr.Run.FinishedTraining, steps)
	}
	checkRunHTML(t, filepath.Join(cfg.ReportOut, "report-e0.html"), js)

	// Everything is published, epoch 1 is not trained: the live report and
	// page show trained steps below published and do not say finished.
	var lv report.Live
	var frag string
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if lv, frag = getLive(t, r.s); !lv.Finished {
			return fmt.Errorf("not everything published yet: %d steps", lv.StepsPublished)
		}
		return nil
	})
	if lv.StepsTrained != steps || lv.StepsPublished != 2*steps {
		t.Errorf("live: %d trained, %d published; want %d trained (epoch 0), %d published", lv.StepsTrained, lv.StepsPublished, steps, 2*steps)
	}
	for _, want := range []string{fmt.Sprintf(`data-key="live.steps_trained">%d<`, steps), fmt.Sprintf(`data-key="live.steps_published">%d<`, 2*steps),
		"publishing finished</b>, trainers still training", fmt.Sprintf("%.1f%%", 50.0)} {
		if !strings.Contains(frag, want) {
			t.Errorf("live page lacks %q:\n%s", want, frag)
		}
	}
	if strings.Contains(frag, "<b>finished</b>") {
		t.Errorf("live page says finished with epoch 1 untrained:\n%s", frag)
	}

	for _, tr := range trs {
		if err := tr.runEpoch(ctx, 1, -1); err != nil {
			t.Fatal(err)
		}
		tr.crash()
	}
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	rr1, _ := readRunReport(t, filepath.Join(cfg.ReportOut, "report-e1.json"))
	latest, js := readRunReport(t, filepath.Join(cfg.ReportOut, "report-latest.json"))
	if rr1.Run.Epoch != 1 || len(rr1.Run.Epochs) != 2 || rr1.Run.Reason != reasonEpochEnd {
		t.Fatalf("report-e1.json: epoch %d with %d epochs, reason %q; want epoch 1 with 2, epoch_end", rr1.Run.Epoch, len(rr1.Run.Epochs), rr1.Run.Reason)
	}
	if fi, err := os.Stat(filepath.Join(cfg.ReportOut, "report-e1.html")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("report-e1.html: %v %v, want mode 0644", fi.Mode(), err)
	}
	if latest.Run.Reason != reasonExit || latest.Run.Epoch != 1 || !latest.Run.FinishedTraining || !latest.Run.FinishedPublishing ||
		latest.Run.StepsTrained != 2*steps || latest.Run.StepsTotal != 2*steps || latest.Live.StepsTrained != 2*steps {
		t.Errorf("report-latest.json: %+v; want exit at epoch 1, %d steps trained of %d, finished", latest.Run, 2*steps, 2*steps)
	}
	for e := range 2 {
		checkEpochMeasured(t, latest.Run.Epochs[e], steps, len(quarantinedIDs(t, cfg.QuarantineDir, e)))
	}
	checkRunHTML(t, filepath.Join(cfg.ReportOut, "report-latest.html"), js)
	if left, _ := filepath.Glob(filepath.Join(cfg.ReportOut, ".report-*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestReportOutOnCancel stops a service mid-epoch (ctx, as SIGTERM does):
// the files say what was trained and measured until then, the last step's
// times too (its feedback may still be in flight when the trainers return:
// the exit waits for it, measureWait).
func TestReportOutOnCancel(t *testing.T) {
	cfg := testConfig(t, corpus(t, 120), 2, 1, "colocated")
	cfg.ReportOut = filepath.Join(t.TempDir(), "run")
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const trained = 2
	var trs []*trainer
	errc := make(chan error, 2)
	for d := range 2 {
		tr := newTrainer(t, cfg, r.s.ClientURL(), d, 0)
		tr.computeSeconds = func(int, int) float64 { return rankSeconds(d) }
		trs = append(trs, tr)
		go func() { errc <- tr.runEpoch(ctx, 0, trained) }()
	}
	for range trs {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if p, ok := r.s.ranks.Trained(); !ok || p.Step < trained {
			return fmt.Errorf("trained to %v (%v)", p, ok)
		}
		if r.s.snapshot() == nil {
			return fmt.Errorf("no comparison yet: %s", r.s.live.PlanningStatus())
		}
		return nil
	})
	if err := r.stop(t); err != nil {
		t.Fatalf("stop: %v", err)
	}
	for _, tr := range trs {
		tr.crash()
	}
	for _, name := range []string{"report-e0", "report-latest"} {
		rr, js := readRunReport(t, filepath.Join(cfg.ReportOut, name+".json"))
		if rr.Run.Reason != reasonExit || rr.Run.StepsTrained != trained || rr.Run.FinishedTraining || len(rr.Run.Epochs) != 1 {
			t.Fatalf("%s: %+v; want exit with %d steps trained", name, rr.Run, trained)
		}
		em := rr.Run.Epochs[0]
		if em.StepsTrained != trained || em.StepsMeasured < trained || em.Ranks[1].Steps != em.StepsMeasured ||
			math.Abs(em.MeasuredImbalance.Mean-1.5) > 1e-9 || em.Steps <= trained {
			t.Errorf("%s epoch 0: %+v; want %d trained and measured at imbalance 1.5 of %d steps", name, em, trained, em.Steps)
		}
		checkRunHTML(t, filepath.Join(cfg.ReportOut, name+".html"), js)
	}
}
