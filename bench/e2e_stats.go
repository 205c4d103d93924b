package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// e2eStep is one rank's record of one step, written by scripts/e2e_rank.py.
type e2eStep struct {
	Step  int `json:"step"`
	Epoch int `json:"epoch"`
	// WallS is the step's wall time on this rank (train_step entry to exit): its own
	// compute plus every wait for the other ranks at the collectives.
	WallS float64 `json:"wall_s"`
	// ComputeS is the rank-local compute the trainer reports as feedback (waits excluded).
	ComputeS float64 `json:"compute_s"`
	// DataWaitS is the time the rank waited for its batch before the step.
	DataWaitS float64 `json:"data_wait_s"`
	Samples   int     `json:"samples"`
}

// e2eRow is one step across the dp ranks (index = rank).
type e2eRow []e2eStep

// e2eResult is one strategy's measured (and planned) numbers.
type e2eResult struct {
	StepSeconds                []float64 // per step: the slowest rank's wall + data wait
	StepMean, StepP50, StepP99 float64
	ComputeMean                float64 // per rank and step: own compute (waits excluded)
	IdleMean                   float64 // per rank and step: slowest rank's compute − own compute
	SyncMean                   float64 // per step: wall − slowest compute (gradient transfer, optimizer)
	IdleFraction               float64 // Σ idle / Σ (wall + data wait)
	DataWaitFraction           float64 // Σ data wait / Σ (wall + data wait)
	ImbMeasured                float64 // mean over steps of max/mean rank compute
	PaddingEff, ImbPredicted   float64 // from the plan's report (whole epoch)
	// ImbCalibratedRatio is measured over predicted imbalance after calibration, and
	// CalibFitErr the calibrated fit's mean relative error (calibratedImbalance).
	ImbCalibratedRatio, CalibFitErr float64
}

// readRankLogs reads rank-<r>.jsonl for r < dp and aligns them by (epoch, step); steps
// missing on some rank are an error (every rank runs every step).
func readRankLogs(dir string, dp int) ([]e2eRow, error) {
	var ranks [][]e2eStep
	for r := range dp {
		steps, err := readRankLog(filepath.Join(dir, fmt.Sprintf("rank-%d.jsonl", r)))
		if err != nil {
			return nil, err
		}
		ranks = append(ranks, steps)
	}
	return alignRanks(ranks)
}

func readRankLog(path string) ([]e2eStep, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []e2eStep
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var s e2eStep
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return nil, fmt.Errorf("%s: line %d: %w", path, len(out)+1, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func alignRanks(ranks [][]e2eStep) ([]e2eRow, error) {
	if len(ranks) == 0 {
		return nil, nil
	}
	var rows []e2eRow
	for i, s := range ranks[0] {
		row := e2eRow{s}
		for r := 1; r < len(ranks); r++ {
			if i >= len(ranks[r]) || ranks[r][i].Step != s.Step || ranks[r][i].Epoch != s.Epoch {
				return nil, fmt.Errorf("rank %d did not log step (%d, %d) as its record %d", r, s.Epoch, s.Step, i)
			}
			row = append(row, ranks[r][i])
		}
		rows = append(rows, row)
	}
	for r := 1; r < len(ranks); r++ {
		if len(ranks[r]) != len(rows) {
			return nil, fmt.Errorf("rank %d logged %d steps, rank 0 %d", r, len(ranks[r]), len(rows))
		}
	}
	return rows, nil
}

func dropWarmup(rows []e2eRow, n int) []e2eRow {
	if n >= len(rows) {
		return nil
	}
	return rows[n:]
}

// summarizeE2E computes the step-time numbers of rows (any number of runs concatenated).
func summarizeE2E(rows []e2eRow) e2eResult {
	var r e2eResult
	var total, idle, sync, wait, imb, compute float64
	var rankSteps int
	for _, row := range rows {
		slowest, maxC, sumC, maxWall := 0.0, 0.0, 0.0, 0.0
		for _, s := range row {
			maxC, sumC, maxWall = max(maxC, s.ComputeS), sumC+s.ComputeS, max(maxWall, s.WallS)
		}
		for _, s := range row {
			t := s.WallS + s.DataWaitS
			slowest = max(slowest, t)
			total += t
			idle += maxC - s.ComputeS
			wait += s.DataWaitS
			compute += s.ComputeS
			rankSteps++
		}
		sync += max(maxWall-maxC, 0)
		r.StepSeconds = append(r.StepSeconds, slowest)
		if sumC > 0 {
			imb += maxC / (sumC / float64(len(row)))
		}
	}
	if len(rows) == 0 {
		return r
	}
	sorted := slices.Sorted(slices.Values(r.StepSeconds))
	for _, v := range sorted {
		r.StepMean += v
	}
	r.StepMean /= float64(len(sorted))
	r.StepP50, r.StepP99 = nearestRank(sorted, 0.5), nearestRank(sorted, 0.99)
	r.IdleMean, r.ComputeMean = idle/float64(rankSteps), compute/float64(rankSteps)
	r.SyncMean = sync / float64(len(rows))
	if total > 0 {
		r.IdleFraction, r.DataWaitFraction = idle/total, wait/total
	}
	r.ImbMeasured = imb / float64(len(rows))
	return r
}

// nearestRank is the q-quantile of sorted values by the nearest-rank method.
func nearestRank(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// writeManifestHead copies the first n lines of a JSONL manifest with image paths made
// absolute (the copy lives elsewhere).
func writeManifestHead(src, dst string, n int) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(out)
	sc := bufio.NewScanner(in)
	sc.Buffer(nil, 16<<20)
	root := filepath.Dir(src)
	for written := 0; written < n && sc.Scan(); {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		if img, ok := line["image"].(string); ok && !filepath.IsAbs(img) {
			line["image"] = filepath.Join(root, filepath.FromSlash(img))
		}
		b, _ := json.Marshal(line)
		w.Write(append(b, '\n'))
		written++
	}
	if err := w.Flush(); err != nil {
		out.Close()
		return err
	}
	if err := sc.Err(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
