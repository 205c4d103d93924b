package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
)

// e2eCalibration: the calibration loop with a deliberately wrong prior. `mmfeed serve`
// plans the skewed corpus with the tiny model's analytic coefficients, text terms made 50×
// too expensive (--cost-scale 1,50,1: the planner thinks captions dominate and pays little
// attention to image size), and streams it to the trainer over NATS for two epochs. With
// --recalibrate K the service refits the model from the ranks' compute-time feedback every
// K steps and replans the unpublished rest (and the next epoch); the control run never
// refits (-1). Measured imbalance per window of K steps shows the effect.
type e2eCalibration struct {
	Every, Epochs int
	// StreamBytes bounds how far the service publishes ahead of the trainer, so a refit
	// still has unpublished steps to replan.
	StreamBytes int64
}

// calibPriorScale is the wrong prior: the vision, text and fusion coefficients' factors.
const calibPriorScale = "1,50,1"

func defaultE2ECalibration() e2eCalibration {
	return e2eCalibration{Every: 5, Epochs: 2, StreamBytes: 48 << 20}
}

func benchE2ECalibration(env *benchEnv, st e2eSettings) (map[string]float64, error) {
	cal := defaultE2ECalibration()
	manifest := filepath.Join(env.tmp, "e2e-strong", "manifest.jsonl")
	bin := filepath.Join(env.tmp, "mmfeed")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/mmfeed").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build mmfeed: %w\n%s", err, out)
	}
	out := map[string]float64{}
	windows := map[string][]calibWindow{}
	for _, mode := range []struct {
		name  string
		every int
	}{{"fixed", -1}, {"calibrated", cal.Every}} {
		rows, rep, err := serveAndTrain(env, bin, manifest, mode.name, mode.every, cal, st)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", mode.name, err)
		}
		w := calibrationWindows(rep.Live.Steps, cal.Every)
		windows[mode.name] = w
		if len(w) > 0 {
			k := "e2e_calib_" + mode.name + "_"
			out[k+"imb_first_window"], out[k+"imb_last_window"] = w[0].Measured, w[len(w)-1].Measured
			out[k+"share_err_first_window"], out[k+"share_err_last_window"] = w[0].ShareErr, w[len(w)-1].ShareErr
		}
		for e, imb := range epochImbalance(rep.Live.Steps) {
			out[fmt.Sprintf("e2e_calib_%s_imb_epoch%d", mode.name, e)] = imb
			fmt.Printf("   %s: epoch %d mean measured imbalance %.3f\n", mode.name, e, imb)
		}
		out["e2e_calib_"+mode.name+"_step_ms_mean"] = 1e3 * summarizeE2E(dropWarmup(rows, st.Warmup)).StepMean
		if c := rep.Live.Calibration; c != nil {
			out["e2e_calib_"+mode.name+"_prior_mean_rel_err"] = c.Prior.MeanRelErr
			out["e2e_calib_"+mode.name+"_fit_mean_rel_err"] = c.Fit.MeanRelErr
			fmt.Printf("   %s: cost model error on %d rank-steps: prior (text ×50, best scale) %.1f%%, refit %.1f%%\n",
				mode.name, c.Fit.N, 100*c.Prior.MeanRelErr, 100*c.Fit.MeanRelErr)
		}
	}
	printCalibrationTable(windows, cal.Every)
	return out, nil
}

// serveReport is the part of /v1/report this benchmark reads.
type serveReport struct {
	Live struct {
		Calibration *balancer.Calibration `json:"calibration"`
		Steps       []liveStep            `json:"steps"`
	} `json:"live"`
}

type liveStep struct {
	Epoch           int       `json:"epoch"`
	Step            int       `json:"step"`
	Segment         int       `json:"segment"`
	Imbalance       float64   `json:"imbalance"`
	PredictedCost   []float64 `json:"predicted_cost"`
	MeasuredSeconds []float64 `json:"measured_seconds"`
}

// measured reports whether every rank's compute time of the step arrived.
func (s liveStep) measured() bool {
	return len(s.MeasuredSeconds) > 0 && !slices.Contains(s.MeasuredSeconds, 0)
}

// calibWindow is k consecutive trained steps of a serve run.
type calibWindow struct {
	From, To  string // epoch:step
	Segment   int    // the newest cost model used (0: the prior)
	Predicted float64
	Measured  float64
	// ShareErr is the mean |predicted − measured| share of a rank in its step's total:
	// how wrong the model in use is about which rank is slower, independent of units.
	ShareErr float64
}

// calibrationWindows groups the measured steps (in order) by k.
func calibrationWindows(steps []liveStep, k int) []calibWindow {
	var done []liveStep
	for _, s := range steps {
		if s.measured() && len(s.PredictedCost) == len(s.MeasuredSeconds) {
			done = append(done, s)
		}
	}
	slices.SortFunc(done, func(a, b liveStep) int { return cmp.Or(a.Epoch-b.Epoch, a.Step-b.Step) })
	var out []calibWindow
	for i := 0; i+k <= len(done); i += k {
		w := calibWindow{From: fmt.Sprintf("%d:%d", done[i].Epoch, done[i].Step), To: fmt.Sprintf("%d:%d", done[i+k-1].Epoch, done[i+k-1].Step)}
		var n int
		for _, s := range done[i : i+k] {
			w.Segment = max(w.Segment, s.Segment)
			w.Predicted += s.Imbalance
			w.Measured += maxOverMean(s.MeasuredSeconds)
			ps, ms := sum(s.PredictedCost), sum(s.MeasuredSeconds)
			for r := range s.MeasuredSeconds {
				if ps > 0 && ms > 0 {
					w.ShareErr += math.Abs(s.PredictedCost[r]/ps - s.MeasuredSeconds[r]/ms)
					n++
				}
			}
		}
		w.Predicted /= float64(k)
		w.Measured /= float64(k)
		if n > 0 {
			w.ShareErr /= float64(n)
		}
		out = append(out, w)
	}
	return out
}

// epochImbalance is the mean measured imbalance (max / mean rank compute) of each
// epoch's fully measured steps: the refit models plan most of epoch 1.
func epochImbalance(steps []liveStep) map[int]float64 {
	total, n := map[int]float64{}, map[int]int{}
	for _, s := range steps {
		if s.measured() {
			total[s.Epoch] += maxOverMean(s.MeasuredSeconds)
			n[s.Epoch]++
		}
	}
	for e := range total {
		total[e] /= float64(n[e])
	}
	return total
}

func sum(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s
}

func maxOverMean(v []float64) float64 {
	if s := sum(v); s > 0 {
		return slices.Max(v) / (s / float64(len(v)))
	}
	return 0
}

// serveAndTrain runs `mmfeed serve` with the wrong prior and the trainer against it.
func serveAndTrain(env *benchEnv, bin, manifest, name string, every int, cal e2eCalibration, st e2eSettings) ([]e2eRow, serveReport, error) {
	var rep serveReport
	natsPort, err := freePort()
	if err != nil {
		return nil, rep, err
	}
	httpPort, err := freePort()
	if err != nil {
		return nil, rep, err
	}
	args := []string{"serve", "--input", manifest, "--job", "e2e" + name, "--dp", fmt.Sprint(st.DP),
		"--global-batch", fmt.Sprint(st.GlobalBatch), "--micro-batches", fmt.Sprint(st.MicroBatches),
		"--resize", "dynamic", "--max-pixels", fmt.Sprint(st.MaxPixels), "--max-length", fmt.Sprint(st.MaxLength),
		"--dtype", "uint8", "--seed", "1", "--model", "tiny", "--cost-scale", calibPriorScale, "--recalibrate", fmt.Sprint(every),
		"--epochs", fmt.Sprint(cal.Epochs), "--stream-max-bytes", fmt.Sprint(cal.StreamBytes), "--workers", "1",
		"--nats-listen", fmt.Sprintf("127.0.0.1:%d", natsPort), "--http", fmt.Sprintf("127.0.0.1:%d", httpPort),
		"--data-dir", filepath.Join(env.tmp, "e2e-nats-"+name)}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	srv := exec.CommandContext(ctx, bin, args...)
	srv.Cancel = func() error { return srv.Process.Signal(syscall.SIGINT) }
	srv.WaitDelay = 10 * time.Second
	var log strings.Builder
	srv.Stdout, srv.Stderr = &log, &log
	if err := srv.Start(); err != nil {
		return nil, rep, err
	}
	defer func() { _ = srv.Process.Signal(syscall.SIGINT); _ = srv.Wait() }()
	addr := fmt.Sprintf("127.0.0.1:%d", natsPort)
	listening := func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
	if err := waitFor(60*time.Second, listening); err != nil {
		return nil, rep, fmt.Errorf("serve did not listen: %w\n%s", err, log.String())
	}
	tst := st
	tst.Steps = cal.Epochs * st.Steps
	type result struct {
		rows []e2eRow
		err  error
	}
	done := make(chan result, 1)
	go func() {
		rows, err := trainE2E(env, "--nats", "nats://"+addr, filepath.Join(env.tmp, "e2e-log-calib-"+name), tst, "--job", "e2e"+name)
		done <- result{rows, err}
	}()
	// The service exits when the job is complete, so its report is read while it runs.
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/report", httpPort)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			if r.err != nil {
				return nil, rep, fmt.Errorf("%w\nserve log:\n%s", r.err, trainerTail(log.String()))
			}
			return r.rows, rep, nil
		case <-tick.C:
			if latest, err := fetchServeReport(url); err == nil && len(latest.Live.Steps) > 0 {
				rep = latest
			}
		}
	}
}

func fetchServeReport(url string) (serveReport, error) {
	var rep serveReport
	resp, err := http.Get(url)
	if err != nil {
		return rep, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return rep, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return rep, json.NewDecoder(resp.Body).Decode(&rep)
}

func trainerTail(s string) string {
	if len(s) > 3000 {
		return s[len(s)-3000:]
	}
	return s
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitFor polls cond every 50 ms until it holds or the deadline passes.
func waitFor(d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out after " + d.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func printCalibrationTable(windows map[string][]calibWindow, k int) {
	fmt.Printf("   per %d trained steps (epoch:step), prior = tiny model, text ×50; model 0 = prior, n = n-th refit\n", k)
	fmt.Printf("   %-12s | %-34s | %-34s\n", "", "fixed (--recalibrate -1)", fmt.Sprintf("calibrated (--recalibrate %d)", k))
	fmt.Printf("   %-12s | %5s %9s %9s %9s | %5s %9s %9s %9s\n", "steps", "model", "imb pred", "imb meas", "share err", "model", "imb pred", "imb meas", "share err")
	f, c := windows["fixed"], windows["calibrated"]
	for i := range max(len(f), len(c)) {
		var label string
		if i < len(c) {
			label = c[i].From + "-" + c[i].To
		} else {
			label = f[i].From + "-" + f[i].To
		}
		fmt.Printf("   %-12s | %s | %s\n", label, windowCells(f, i), windowCells(c, i))
	}
}

func windowCells(v []calibWindow, i int) string {
	if i >= len(v) {
		return fmt.Sprintf("%5s %9s %9s %9s", "-", "-", "-", "-")
	}
	w := v[i]
	return fmt.Sprintf("%5d %9.3f %9.3f %9.4f", w.Segment, w.Predicted, w.Measured, w.ShareErr)
}
