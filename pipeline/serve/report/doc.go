// Package report is what `mmfeed serve` reports about a run: the live
// report (/v1/report's "live", the page's live section) and the run report
// (`serve --report-out DIR`, docs/report.md), built from what the service
// tells it.
//
// # What it owns
//
// State (NewState; live.go, live_epoch.go): the epochs the live report
// shows (SetEpoch), the newest published steps (Published, from the
// publisher) with the step times and data waits the trainers reported
// (Measured, from the control handlers), every epoch's quarantine counts
// and reasons (Quarantined, QuarantineCounts, WithEpochQuarantine), and
// the run record (record.go: each dp rank's measured step times, the
// measured imbalance beside the predicted one, per epoch over the whole
// run: EpochList, Unmeasured, MeasuredEpochs). Snapshot returns the
// parts of the live report State holds; PlanningStatus says why there is
// no comparison yet. Its lock and the run record's are leaves.
//
// The report's JSON types: LiveReport, Live, LiveStep, RankStatus, Rates
// and Stats (the service's instrumentation, serve.Stats; NewRates) for the live
// report; RunReport, RunSummary, EpochMeasured, ImbalanceStats and
// RankMeasured for the run report (run.go). WriteRunFiles writes one run
// report's JSON and HTML (runhtml.go) files, each atomically.
//
// Views (NewViews; liveview.go): the page's live section
// (balancer.LiveView) of a Live, with the calibration's fit history refit
// from an ObservationSource (serve's calibrator) and cached (a leaf lock).
//
// ProgressMeter and ProgressLine (progress.go): the progress log line's
// arithmetic (rate and ETA through an epoch). Imbalance is max/mean of a
// step's rank costs or times.
//
// # What it must not do
//
// It never imports serve: serve fills what it alone knows (job, ranks,
// steps trained, calibration, throughput) into Snapshot's report, decides
// when the run report files are written (reportglue.go: reportLoop,
// epochEnds, atExit) and logs. It takes no other package's lock (an epoch
// plan is read through epochs.Plan's verbs), has no NATS package of its
// own and no metrics (internal/arch).
package report
