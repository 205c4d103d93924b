package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline"
)

// The run report (serve.Config.ReportOut, `serve --report-out DIR`) is what the
// live report says, kept after the run: the `mmfeed report` JSON and HTML of
// an epoch (its strategy comparison), the live section as /v1/report has it,
// and "run": the measured figures of every epoch so far (runRecord). Files,
// each written atomically (a temporary file in DIR, then a rename):
//
//   - report-e<epoch>.json and report-e<epoch>.html, once every rank has
//     trained past the epoch (serve checks every reportEvery), and at exit for
//     every epoch not written yet (with what it has then);
//   - report-latest.json and report-latest.html, the newest of those, and
//     rewritten when Run returns: the job's end, an error, SIGTERM or ctx.

// RunReport is one --report-out JSON file.
type RunReport struct {
	// Report is the epoch's strategy comparison (`mmfeed report --json`),
	// absent when no epoch was planned; its quarantine counts are the epoch's.
	*balancer.Report
	// Mixture is a mixture epoch's per-source lines (/v1/report's
	// "mixture"), with Report; absent for a plain input.
	Mixture *pipeline.MixtureReport `json:"mixture,omitempty"`
	Live    Live                    `json:"live"`
	Run     RunSummary              `json:"run"`
}

// RunSummary is what the trainers did, as the service saw it.
type RunSummary struct {
	Job string `json:"job"`
	// Epoch is the epoch the file is about; Reason is "epoch_end" (every
	// rank trained past it) or "exit" (Run returned).
	Epoch     int       `json:"epoch"`
	Reason    string    `json:"reason"`
	WrittenAt time.Time `json:"written_at"`
	// StepsTotal is the job's step count (its epochs' planned steps, the
	// current epoch's count for those not planned yet); StepsPublished and
	// StepsTrained as in Live.
	StepsTotal         int  `json:"steps_total"`
	StepsPublished     int  `json:"steps_published"`
	StepsTrained       int  `json:"steps_trained"`
	FinishedPublishing bool `json:"finished_publishing"`
	FinishedTraining   bool `json:"finished_training"`
	// Epochs are the measured figures of every epoch this service published
	// steps of, in epoch order.
	Epochs []EpochMeasured `json:"epochs"`
}

// EpochMeasured is one epoch's measured figures.
type EpochMeasured struct {
	Epoch int `json:"epoch"`
	// Steps is the epoch's planned step count (0: unknown); StepsPublished
	// counts the steps this service published (a republished step once);
	// StepsTrained those every rank acknowledged; StepsMeasured those every
	// rank reported a step time for; StepsIncomplete those some rank never
	// reported (forgotten after maxPendingSteps newer ones).
	Steps           int `json:"steps"`
	StepsPublished  int `json:"steps_published"`
	StepsTrained    int `json:"steps_trained"`
	StepsMeasured   int `json:"steps_measured"`
	StepsIncomplete int `json:"steps_incomplete"`
	// MeasuredImbalance is max/mean of the dp ranks' measured step times,
	// over the measured steps; PredictedImbalance is the plan's max/mean of
	// the rank costs over the same steps; PlannedImbalance the plan's over
	// every published step.
	MeasuredImbalance  ImbalanceStats `json:"measured_imbalance"`
	PredictedImbalance ImbalanceStats `json:"predicted_imbalance"`
	PlannedImbalance   ImbalanceStats `json:"planned_imbalance"`
	// Ranks are the dp ranks' step times over the measured steps (a dp
	// rank's time is its slowest mp rank's).
	Ranks []RankMeasured `json:"ranks"`
	// Quarantined counts the epoch's quarantined samples by reason.
	Quarantined map[string]int64 `json:"quarantined"`
}

// ImbalanceStats summarises per-step imbalances (max/mean, 1 is perfect).
type ImbalanceStats struct {
	Steps int     `json:"steps"`
	Mean  float64 `json:"mean"`
	Max   float64 `json:"max"`
}

// RankMeasured is one dp rank's measured step times.
type RankMeasured struct {
	DP                  int     `json:"dp"`
	Steps               int     `json:"steps"`
	MeanSeconds         float64 `json:"mean_seconds"`
	MaxSeconds          float64 `json:"max_seconds"`
	TotalSeconds        float64 `json:"total_seconds"`
	MeanDataWaitSeconds float64 `json:"mean_data_wait_seconds"`
}

// WriteRunFiles writes rr as the latest files in dir (report-latest.json
// and .html, the page's live section lv) and, with epochFile, as epoch e's
// (report-e<e>.json and .html), each atomically (writeAtomic).
func WriteRunFiles(dir string, e int, epochFile bool, rr RunReport, lv *balancer.LiveView) error {
	js, err := json.MarshalIndent(rr, "", "  ")
	if err != nil {
		return err
	}
	var page bytes.Buffer
	if err := writeRunHTML(&page, rr, lv); err != nil {
		return err
	}
	js = append(js, '\n')
	bases := []string{"report-latest"}
	if epochFile {
		bases = append([]string{fmt.Sprintf("report-e%d", e)}, bases...)
	}
	for _, base := range bases {
		if err := writeAtomic(filepath.Join(dir, base+".json"), js); err != nil {
			return err
		}
		if err := writeAtomic(filepath.Join(dir, base+".html"), page.Bytes()); err != nil {
			return err
		}
	}
	return nil
}

// writeAtomic writes b to path through a temporary file in its directory.
func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".report-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o644); err != nil { // CreateTemp's 0600 would hide the report from its readers
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
