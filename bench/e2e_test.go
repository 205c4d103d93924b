package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestSummarizeE2E(t *testing.T) {
	// Two steps, two ranks. Step 0: rank 1 computes 0.3 s, rank 0 0.1 s; both finish at 0.5 s.
	rows := []e2eRow{
		{{Step: 0, WallS: 0.5, ComputeS: 0.1}, {Step: 0, WallS: 0.5, ComputeS: 0.3, DataWaitS: 0.1}},
		{{Step: 1, WallS: 0.2, ComputeS: 0.1}, {Step: 1, WallS: 0.2, ComputeS: 0.1}},
	}
	r := summarizeE2E(rows)
	tests := []struct {
		name      string
		got, want float64
	}{
		{"step mean (slowest rank, wait included)", r.StepMean, (0.6 + 0.2) / 2},
		{"step p50", r.StepP50, 0.2},
		{"step p99", r.StepP99, 0.6},
		{"compute mean", r.ComputeMean, (0.1 + 0.3 + 0.1 + 0.1) / 4},
		{"idle mean (wait for the slowest rank)", r.IdleMean, 0.2 / 4},
		{"sync mean (wall − slowest compute)", r.SyncMean, (0.2 + 0.1) / 2},
		{"data wait fraction", r.DataWaitFraction, 0.1 / (0.5 + 0.6 + 0.2 + 0.2)},
		{"measured imbalance", r.ImbMeasured, (0.3/0.2 + 1) / 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !near(tt.got, tt.want) {
				t.Errorf("got %g, want %g", tt.got, tt.want)
			}
		})
	}
	if got := summarizeE2E(nil); got.StepMean != 0 || len(got.StepSeconds) != 0 {
		t.Errorf("summarizeE2E(nil) = %+v, want zero", got)
	}
}

func TestAlignRanks(t *testing.T) {
	s := func(step int) e2eStep { return e2eStep{Step: step} }
	tests := []struct {
		name    string
		ranks   [][]e2eStep
		rows    int
		wantErr string
	}{
		{"aligned", [][]e2eStep{{s(0), s(1)}, {s(0), s(1)}}, 2, ""},
		{"rank 1 short", [][]e2eStep{{s(0), s(1)}, {s(0)}}, 0, "did not log step"},
		{"rank 1 long", [][]e2eStep{{s(0)}, {s(0), s(1)}}, 0, "logged 2 steps"},
		{"different steps", [][]e2eStep{{s(0), s(1)}, {s(0), s(2)}}, 0, "did not log step"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := alignRanks(tt.ranks)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || len(rows) != tt.rows {
				t.Fatalf("got %d rows, %v; want %d", len(rows), err, tt.rows)
			}
		})
	}
}

func TestReadRankLogs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("rank-0.jsonl", `{"step":0,"epoch":0,"wall_s":0.5,"compute_s":0.2,"data_wait_s":0,"samples":3}`+"\n")
	write("rank-1.jsonl", `{"step":0,"epoch":0,"wall_s":0.5,"compute_s":0.4,"data_wait_s":0,"samples":5}`+"\n")
	rows, err := readRankLogs(dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rows[0][1].ComputeS, 0.4; len(rows) != 1 || got != want {
		t.Errorf("rank 1 compute %g, want %g", got, want)
	}
	write("rank-1.jsonl", "{not json\n")
	if _, err := readRankLogs(dir, 2); err == nil {
		t.Error("a corrupt rank log gave no error")
	}
}

func TestCalibrationWindows(t *testing.T) {
	steps := []liveStep{
		{Epoch: 0, Step: 1, Segment: 0, Imbalance: 1.0, PredictedCost: []float64{1, 1}, MeasuredSeconds: []float64{1, 3}},
		{Epoch: 0, Step: 0, Segment: 0, Imbalance: 1.2, PredictedCost: []float64{1, 1}, MeasuredSeconds: []float64{1, 1}},
		{Epoch: 0, Step: 2, Segment: 1, Imbalance: 1.0, PredictedCost: []float64{1, 3}, MeasuredSeconds: []float64{1, 3}},
		{Epoch: 1, Step: 0, Segment: 1, Imbalance: 1.0, PredictedCost: []float64{1, 1}, MeasuredSeconds: []float64{1, 1}},
		{Epoch: 1, Step: 1, Segment: 1, Imbalance: 1.0, PredictedCost: []float64{1, 1}, MeasuredSeconds: []float64{0, 0}}, // not measured yet
	}
	w := calibrationWindows(steps, 2)
	if len(w) != 2 {
		t.Fatalf("got %d windows, want 2: %+v", len(w), w)
	}
	tests := []struct {
		name      string
		got, want float64
	}{
		{"first window predicted", w[0].Predicted, 1.1},
		{"first window measured", w[0].Measured, (1 + 1.5) / 2},
		{"first window share error", w[0].ShareErr, (0.25 + 0.25) / 4},
		{"second window share error", w[1].ShareErr, 0},
		{"second window model", float64(w[1].Segment), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !near(tt.got, tt.want) {
				t.Errorf("got %g, want %g", tt.got, tt.want)
			}
		})
	}
	if got, want := w[0].From+"-"+w[0].To, "0:0-0:1"; got != want {
		t.Errorf("first window %s, want %s (sorted by epoch, step)", got, want)
	}
}

func TestWriteManifestHead(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "m.jsonl")
	body := `{"image":"a.png","text":"x"}` + "\n" + "garbage\n" + `{"image":"/abs/b.png","text":"y"}` + "\n" + `{"image":"c.png","text":"z"}` + "\n"
	if err := os.WriteFile(src, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "out.jsonl")
	if err := writeManifestHead(src, dst, 2); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(dst)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2:\n%s", len(lines), b)
	}
	for i, want := range []string{filepath.Join(dir, "a.png"), "/abs/b.png"} {
		if !strings.Contains(lines[i], `"image":"`+want+`"`) {
			t.Errorf("line %d = %s, want image %s", i, lines[i], want)
		}
	}
}

func TestEpochImbalance(t *testing.T) {
	steps := []liveStep{
		{Epoch: 0, Step: 0, MeasuredSeconds: []float64{1, 3}}, // 1.5
		{Epoch: 0, Step: 1, MeasuredSeconds: []float64{2, 2}}, // 1
		{Epoch: 0, Step: 2, MeasuredSeconds: []float64{2, 0}}, // not measured by every rank
		{Epoch: 1, Step: 0, MeasuredSeconds: []float64{1, 1, 2}},
	}
	got := epochImbalance(steps)
	want := map[int]float64{0: 1.25, 1: 1.5}
	if len(got) != len(want) || math.Abs(got[0]-want[0]) > 1e-12 || math.Abs(got[1]-want[1]) > 1e-12 {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestCalibratedImbalance: rank compute times that follow a model far from the FLOP
// prior (text 20× dearer, a fixed overhead) are predicted after calibration, out of
// sample, so measured over predicted imbalance is 1; with the prior it is not.
func TestCalibratedImbalance(t *testing.T) {
	prior, err := balancer.NewCostModel(balancer.TinyShape())
	if err != nil {
		t.Fatal(err)
	}
	truth := prior
	truth.Coef[balancer.Text] = truth.Coef[balancer.Text].Scale(20)
	feats := e2ePlanFeatures{}
	var round []e2eRow
	for step := range 20 {
		var row e2eRow
		for r := range 2 {
			l, p := 10+37*((step*3+r*7)%11), 64+200*((step*5+r*3)%7)
			f := balancer.FeaturesOf(l, p, 0.5).Add(balancer.FeaturesOf(3*l/2, p/2, 0.2))
			feats[step] = append(feats[step], f)
			row = append(row, e2eStep{Step: step, ComputeS: 1e-3*truth.CostOf(f).Total() + 0.01})
		}
		round = append(round, row)
	}
	ratio, fitErr, err := calibratedImbalance(prior, feats, [][]e2eRow{round, round})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(ratio-1) > 1e-3 || fitErr > 1e-3 {
		t.Errorf("calibrated: measured / predicted %v, fit error %v; want 1 and 0", ratio, fitErr)
	}
	var meas, pred float64
	for _, row := range round {
		f := feats[row[0].Step]
		meas += maxOverMean([]float64{row[0].ComputeS, row[1].ComputeS})
		pred += maxOverMean([]float64{prior.CostOf(f[0]).Total(), prior.CostOf(f[1]).Total()})
	}
	if math.Abs(meas/pred-1) < 0.01 {
		t.Fatalf("the prior already predicts the imbalance (%v): the test cannot tell calibration happened", meas/pred)
	}
	if r, _, _ := calibratedImbalance(prior, feats, [][]e2eRow{round}); r != 0 {
		t.Errorf("one round: got %v, want 0 (no out-of-sample fit)", r)
	}
	if _, _, err := calibratedImbalance(prior, e2ePlanFeatures{}, [][]e2eRow{round, round}); err == nil {
		t.Error("steps without plan features: no error")
	}
}
