package serve

import (
	"fmt"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/prometheus/client_golang/prometheus"
)

// registerWork puts the planner's counters on /metrics: the items issued,
// answered, dropped as duplicates, issued early and issued again; the
// results rejected, by reason; the workers' failure reports; the
// predicted against measured item times (their sums over the timed items:
// the mean is sum / count) and the fitted cost model's coefficients.
func (s *Service) registerWork() error {
	counts := s.work.Counts
	for kind, c := range map[string]func(work.Counts) int64{
		"issued": func(c work.Counts) int64 { return c.Issued }, "results": func(c work.Counts) int64 { return c.Results },
		"duplicates": func(c work.Counts) int64 { return c.Duplicates }, "early": func(c work.Counts) int64 { return c.Early },
		"reissued": func(c work.Counts) int64 { return c.Reissued }} {
		if err := s.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mmfeed_serve_work_items_total",
			Help: "Planner: batch items issued, answered by a worker, duplicate results dropped, heavy items issued early, and items issued again after a rejected result.", ConstLabels: prometheus.Labels{"kind": kind}},
			func() float64 { return float64(c(counts())) })); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	if err := s.registerWorkTimes(); err != nil {
		return err
	}
	if err := s.reg.Register(&rejectCollector{counts}); err != nil {
		return fmt.Errorf("serve: metrics: %w", err)
	}
	for kind, c := range map[string]func(work.Counts) int64{
		"batch": func(c work.Counts) int64 { return c.BatchFailures }, "features": func(c work.Counts) int64 { return c.FeatureFailures }} {
		if err := s.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mmfeed_serve_work_failures_total",
			Help: "Planner: workers' reports that an item failed on the job's input (the dataset does not open there, another dataset); the reasons are in the log.", ConstLabels: prometheus.Labels{"kind": kind}},
			func() float64 { return float64(c(counts())) })); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	return nil
}

// registerWorkTimes puts the predicted against measured item times on
// /metrics: their sums over the timed items (the mean is sum / count), and
// the fitted cost model's coefficients.
func (s *Service) registerWorkTimes() error {
	read := func(f func(t work.Tally) float64) func() float64 {
		return func() float64 { return f(s.work.Total()) }
	}
	for kind, f := range map[string]func(work.Tally) float64{
		"predicted": func(t work.Tally) float64 { return t.Predicted },
		"measured":  func(t work.Tally) float64 { return t.Measured },
		"abs_error": func(t work.Tally) float64 { return t.AbsError },
	} {
		if err := s.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mmfeed_serve_work_item_seconds_total",
			Help: "Planner: the predicted and measured worker seconds of the timed batch items, and their absolute difference, summed.", ConstLabels: prometheus.Labels{"kind": kind}},
			read(f))); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	if err := s.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mmfeed_serve_work_items_timed_total",
		Help: "Planner: batch items whose worker time was compared with the prediction."},
		read(func(t work.Tally) float64 { return float64(t.N) }))); err != nil {
		return fmt.Errorf("serve: metrics: %w", err)
	}
	for i, dim := range balancer.WorkCostNames {
		if err := s.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mmfeed_serve_work_cost_seconds",
			Help: "Planner: the fitted worker seconds per unit of a batch item's cost: per megapixel of JPEG or of other formats, per encoded megabyte, per sample.", ConstLabels: prometheus.Labels{"per": dim}},
			func() float64 { return s.work.CostCoefficients()[i] })); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	return nil
}

// rejectCollector reports the planner's rejected results by reason at
// scrape time (work.Counts.Rejected: every reason from the start).
type rejectCollector struct{ counts func() work.Counts }

var descRejected = prometheus.NewDesc("mmfeed_serve_work_results_rejected_total",
	"Planner: workers' batch results (and feature results, reason rows) that did not match the item issued (ids, order, rows, dtype, shape, tokens, config, ...), by reason; each was dropped and its item issued again.",
	[]string{"reason"}, nil)

func (c *rejectCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descRejected }

func (c *rejectCollector) Collect(ch chan<- prometheus.Metric) {
	for reason, n := range c.counts().Rejected {
		ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(n), reason)
	}
}

// Autoscaling gauges (planner role): what an autoscaler needs to size the
// worker pool, from measured times only. docs/deployment.md, "Autoscaling
// workers", explains each formula, unit and window.
//
//   - mmfeed_serve_work_backlog_seconds: Σ over the issued batch items not
//     yet delivered (queued or in flight) of their predicted worker seconds
//     (the cost model fitted to the workers' measured item times).
//   - mmfeed_serve_consumption_microbatches_per_second: the micro-batches
//     (work items: one dp rank's micro-batch) the trainers took per second
//     over the window; mmfeed_serve_demand_microbatches_per_second is the
//     same over the time they did not wait for data (their reported data
//     wait taken out): what they would take were the workers fast enough.
//   - mmfeed_serve_slack_seconds: min over the ranks of the steps built
//     ahead of the rank divided by its demand in steps per second: how long
//     until the earliest rank would wait.
//   - mmfeed_serve_work_seconds_per_item: the mean measured worker seconds of
//     the items finished in the window; mmfeed_serve_workers and
//     mmfeed_serve_worker_slots: the workers (connections) that finished
//     them, and their slots.
//   - mmfeed_serve_workers_needed = demand × seconds per item ÷ slots per
//     worker: workers of the present size that keep up with the demand (no
//     ceiling: an HPA targets averageValue 1).

// scaleWindow is the sliding window of the rates, the per-item seconds and
// the workers (a variable so tests can shorten it).
var scaleWindow = 30 * time.Second

// stepsBetween is the number of steps from p to q (0 when q is not after
// p), with steps(e) the step count of epoch e.
func stepsBetween(p, q proto.Pos, steps func(int) int) int {
	if !p.Less(q) {
		return 0
	}
	if p.Epoch == q.Epoch {
		return q.Step - p.Step
	}
	n := max(steps(p.Epoch)-p.Step, 0) + q.Step
	for e := p.Epoch + 1; e < q.Epoch; e++ {
		n += steps(e)
	}
	return n
}

// advanced is the Ranks's hook: rank r's trainer moved from one step
// to a later one.
func (s *Service) advanced(r int, from, to proto.Pos) {
	if s.work != nil {
		s.work.Autoscaler().Taken(r, stepsBetween(from, to, s.epochs.Steps))
	}
}

// readySteps returns, per rank, the steps built ahead of its next needed
// step: published (in the outbox or the stream), queued to its publisher,
// or delivered by the workers in order after those.
func (s *Service) readySteps() []float64 {
	ranks := s.ranks.All()
	out := make([]float64, len(ranks))
	for r, rs := range ranks {
		next := s.epochs.Norm(rs.Next())
		base := s.epochs.Norm(rs.Cursor())
		if q, ok := s.work.QueuedThrough(); ok && base.Less(s.epochs.Norm(q)) {
			base = s.epochs.Norm(q)
		}
		if base.Less(next) {
			base = next
		}
		built := s.work.BuiltFrom(r/s.cfg.MP, s.cfg.Pipeline.Plan.MicroBatches, base, s.epochs.Norm)
		out[r] = float64(stepsBetween(next, built, s.epochs.Steps))
	}
	return out
}

// scaleCollector reports the autoscaling gauges at scrape time, from memory.
type scaleCollector struct{ s *Service }

var (
	descBacklog = prometheus.NewDesc("mmfeed_serve_work_backlog_seconds",
		"Planner: predicted worker seconds (one slot) of the batch items issued and not yet delivered, queued or in flight.", nil, nil)
	descConsumption = prometheus.NewDesc("mmfeed_serve_consumption_microbatches_per_second",
		"Planner: micro-batches (work items: one dp rank's micro-batch) the trainers took per second over the window.", nil, nil)
	descDemand = prometheus.NewDesc("mmfeed_serve_demand_microbatches_per_second",
		"Planner: micro-batches per second the trainers take over the time they did not wait for data (their reported data wait taken out).", nil, nil)
	descSlack = prometheus.NewDesc("mmfeed_serve_slack_seconds",
		"Planner: seconds until the earliest rank would wait: min over ranks of the steps built ahead of it over its demand in steps per second.", nil, nil)
	descItemSeconds = prometheus.NewDesc("mmfeed_serve_work_seconds_per_item",
		"Planner: mean measured worker seconds (one slot) of the batch items finished in the window.", nil, nil)
	descWorkers = prometheus.NewDesc("mmfeed_serve_workers",
		"Planner: workers that finished batch items in the window.", nil, nil)
	descWorkerSlots = prometheus.NewDesc("mmfeed_serve_worker_slots",
		"Planner: the slots of the workers that finished batch items in the window.", nil, nil)
	descNeeded = prometheus.NewDesc("mmfeed_serve_workers_needed",
		"Planner: workers of the present mean size that keep up with the trainers' demand: demand × item seconds ÷ slots per worker (no ceiling).", nil, nil)
	descWindow = prometheus.NewDesc("mmfeed_serve_autoscale_window_seconds",
		"Planner: the sliding window of the autoscaling gauges.", nil, nil)
)

func (c *scaleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBacklog, descConsumption, descDemand, descSlack, descItemSeconds, descWorkers, descWorkerSlots, descNeeded, descWindow} {
		ch <- d
	}
}

func (c *scaleCollector) Collect(ch chan<- prometheus.Metric) {
	sn := c.s.scaleSnapshot()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	g(descWindow, c.s.work.Autoscaler().Window().Seconds())
	g(descConsumption, sn.Consumption)
	g(descDemand, sn.Demand)
	if sn.BacklogOK {
		g(descBacklog, sn.Backlog)
	}
	if sn.SlackOK {
		g(descSlack, sn.Slack)
	}
	if sn.Items.N > 0 {
		g(descItemSeconds, sn.Items.SecsPerItem)
		g(descWorkers, float64(sn.Items.Workers))
		g(descWorkerSlots, float64(sn.Items.Slots))
	}
	if sn.NeededOK {
		g(descNeeded, sn.Needed)
	}
}

// scaleSnapshot computes the autoscaling gauges now (planner role).
func (s *Service) scaleSnapshot() work.Scale {
	ready := s.readySteps()
	sn := s.work.Autoscaler().Snapshot(ready, s.cfg.MP, s.cfg.Pipeline.Plan.MicroBatches)
	sn.Backlog, sn.BacklogOK = s.work.BacklogSeconds()
	return sn
}

// registerScale installs the rank hook and the autoscaling gauges (planner
// role, before the control handlers run).
func (s *Service) registerScale() error {
	s.work.SetAutoscaler(work.NewAutoscaler(s.cfg.ranks(), scaleWindow))
	s.ranks.SetAdvanced(s.advanced)
	return s.reg.Register(&scaleCollector{s})
}

// scaleFeedback records a validated feedback's data wait (planner role).
func (s *Service) scaleFeedback(fb proto.Feedback) {
	if s != nil && s.work != nil {
		s.work.Autoscaler().Waited(fb.DPRank*s.cfg.MP+fb.MPRank, fb.DataWaitSeconds)
	}
}
