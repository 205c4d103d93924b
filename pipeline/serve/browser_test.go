package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/browsertest"
	"github.com/mmfeed/mmfeed/internal/reportcheck"
	"github.com/mmfeed/mmfeed/pipeline/serve/report"
)

// TestReportPageInBrowser loads the live report page in headless Chromium
// during a serve run: the browser signs in with the token in the URL (cookie),
// every number the page shows equals /v1/report, and the live section fills
// in from trainer feedback without a reload. Screenshots are test artifacts
// (MMFEED_ARTIFACTS).
func TestReportPageInBrowser(t *testing.T) {
	b := browsertest.New(t)
	cfg := testConfig(t, corpus(t, 120), 2, 1, "colocated")
	cfg.HTTPToken = "s3cret"
	cfg.MinObservations = 8
	r := start(t, cfg)
	base := "http://" + r.s.HTTPAddr()
	fetch := func() ([]byte, report.LiveReport, error) {
		req, _ := http.NewRequest("GET", base+"/v1/report", nil)
		req.Header.Set("Authorization", "Bearer "+cfg.HTTPToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, report.LiveReport{}, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var lr report.LiveReport
		if err := json.Unmarshal(body, &lr); err != nil {
			return nil, lr, fmt.Errorf("/v1/report: %v: %.200s", err, body)
		}
		return body, lr, nil
	}
	report := func() ([]byte, report.LiveReport) {
		t.Helper()
		body, lr, err := fetch()
		if err != nil {
			t.Fatal(err)
		}
		return body, lr
	}
	// Everything is published before the page opens, so the plan-time part
	// (quarantine counts included) no longer moves.
	checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		if _, lr, err := fetch(); err != nil || lr.Report == nil || !lr.Live.Finished {
			return fmt.Errorf("not everything published yet (%v)", err)
		}
		return nil
	})

	b.Open(base + "/?token=" + cfg.HTTPToken)
	if u := b.URL(); u != base+"/" {
		t.Fatalf("after sign-in the browser is at %s, want %s (token exchanged for a cookie)", u, base+"/")
	}
	b.EvalString(`window.mmfeedMark = "same page"`)
	dom := b.DOM()
	if !strings.Contains(dom, "no trainer feedback yet") {
		t.Fatalf("before any trainer the live section should say so:\n%.2000s", dom)
	}
	js, _ := report()
	n, err := reportcheck.Compare(dom, js)
	if err != nil {
		t.Fatal(err)
	}
	if n < 40 {
		t.Errorf("only %d numbers checked on the page", n)
	}
	b.Screenshot("report-live-before.png")

	// Trainers consume all but the last step, with compute times the
	// calibration can fit, and stay registered: the service keeps serving.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	steps := js2steps(t, js)
	trs := runTrainersPartial(t, ctx, cfg, r.s.ClientURL(), steps-1)
	last := fmt.Sprintf("live.step.0.%d.measured_seconds.1", steps-2)
	dom, ok := b.WaitDOM(20*time.Second, func(dom string) bool {
		_, shown := reportcheck.Values(dom)[last]
		return shown && strings.Contains(dom, `data-key="live.calibration.fit.r2"`)
	})
	if !ok {
		t.Fatalf("the live section did not show step %d's measurements and the fit in 20s:\n%.3000s", steps-2, dom)
	}
	if got := b.EvalString(`String(window.mmfeedMark) + " " + document.getElementById("live").dataset.updates`); !strings.HasPrefix(got, "same page ") || got == "same page 0" {
		t.Errorf("live section updated by a reload, not in place: %q", got)
	}
	js, lr := report()
	if n, err := reportcheck.Compare(dom, js); err != nil {
		t.Fatal(err)
	} else if vals := reportcheck.Values(dom); len(vals) < n || vals["live.calibration.fit.n"] == "" {
		t.Errorf("live numbers missing: %v", vals)
	}
	if lr.Live.Calibration == nil {
		t.Error("the report has no calibration")
	}
	b.Screenshot("report-live-after.png")
	_ = trs
}

// js2steps reads the epoch's step count from a /v1/report body.
func js2steps(t *testing.T, body []byte) int {
	var r struct {
		Steps int `json:"steps"`
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Steps < 3 {
		t.Fatalf("report steps %d (%v)", r.Steps, err)
	}
	return r.Steps
}

// runTrainersPartial runs one trainer per rank for stop steps of epoch 0,
// with deterministic compute times and a short pause per step, and returns
// them still registered.
func runTrainersPartial(t *testing.T, ctx context.Context, cfg Config, url string, stop int) []*trainer {
	t.Helper()
	var trs []*trainer
	errc := make(chan error, cfg.ranks())
	for rk := range cfg.ranks() {
		tr := newTrainer(t, cfg, url, rk/cfg.MP, rk%cfg.MP)
		tr.computeSeconds = func(epoch, step int) float64 { return trueSeconds(tr, epoch, step) }
		tr.stepDelay = 100 * time.Millisecond
		trs = append(trs, tr)
		go func() { errc <- tr.runEpoch(ctx, 0, stop) }()
	}
	for range trs {
		if err := <-errc; err != nil {
			t.Fatalf("trainer: %v", err)
		}
	}
	t.Cleanup(func() {
		for _, tr := range trs {
			tr.crash()
		}
	})
	return trs
}
