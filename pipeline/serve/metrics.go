package serve

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/report"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/prometheus/client_golang/prometheus"
)

type stage int

const (
	stagePreprocess stage = iota // the publisher waited for the preprocessing workers
	stageBuild                   // proto.BuildRecord
	stageEncode                  // proto.EncodeIPC
	stagePublish                 // chunking and JetStream publish, backpressure waits included
	numStages
)

var stageNames = [numStages]string{"preprocess", "build", "encode", "publish"}

// metrics are the service's Prometheus metrics, on the service's registry.
type metrics struct {
	s     *Service
	start time.Time

	samples, bytes, batches, chunks  prometheus.Counter
	retries, rewinds, recalibrations prometheus.Counter
	stageSeconds                     *prometheus.CounterVec
	imbalance                        prometheus.Histogram
	control                          *prometheus.CounterVec
	repliesRefused                   *prometheus.CounterVec
	assetFailures                    prometheus.Counter
	stateWriteFailures               prometheus.Counter
	assetsRecreated                  *prometheus.CounterVec
	dataWait, compute                *prometheus.CounterVec

	nanos                           [numStages]atomic.Int64
	nSamples, nBytes, nBat, nChunks atomic.Int64
}

func newMetrics(s *Service) *metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "mmfeed", Subsystem: "serve", Name: name, Help: help})
	}
	rankLabels := []string{"dp", "mp"}
	return &metrics{s: s, start: time.Now(),
		samples:        c("samples_total", "Real (weight > 0) samples published, counted once per dp rank."),
		bytes:          c("bytes_total", "Arrow IPC payload bytes published."),
		batches:        c("batches_total", "Micro-batch payloads published (every dp and mp rank)."),
		chunks:         c("chunks_total", "Chunk messages published (a payload over max_payload is several)."),
		retries:        c("publish_retries_total", "Chunk publishes repeated after a full stream or a lost ack."),
		rewinds:        c("rewinds_total", "Ranks republished from an earlier step with a new generation."),
		recalibrations: c("recalibrations_total", "Mid-epoch replans with a recalibrated cost model."),
		stageSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "mmfeed", Subsystem: "serve", Name: "stage_seconds_total",
			Help: "Seconds spent per stage: preprocess (waiting for workers), build, encode, publish."}, []string{"stage"}),
		imbalance: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "mmfeed", Subsystem: "serve", Name: "step_imbalance",
			Help:    "Predicted max/mean rank cost of each published step.",
			Buckets: []float64{1, 1.005, 1.01, 1.02, 1.03, 1.05, 1.1, 1.2, 1.5, 2, 3}}),
		control: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "mmfeed", Subsystem: "serve", Name: "control_messages_total",
			Help: "Control messages received, by kind and result (ok, merged into one in flight, refused, unacknowledged)."}, []string{"kind", "result"}),
		repliesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "mmfeed", Subsystem: "serve", Name: "replies_refused_total",
			Help: "Requests not answered because their reply subject is outside the requester's inbox, by kind and reason (not_inbox, service, foreign, not_own)."}, []string{"kind", "reason"}),
		dataWait: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "mmfeed", Subsystem: "serve", Name: "data_wait_seconds_total",
			Help: "Seconds trainer ranks reported blocked on the next batch."}, rankLabels),
		compute: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "mmfeed", Subsystem: "serve", Name: "compute_seconds_total",
			Help: "Seconds of forward+backward trainer ranks reported."}, rankLabels),
		assetFailures:      c("asset_check_failures_total", "Checks of the job's JetStream assets that could not reach them."),
		stateWriteFailures: c("state_write_failures_total", "Writes of the job's state (positions, epochs, generations) that failed, a full disk among them; fenced writes are not counted."),
		assetsRecreated: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "mmfeed", Subsystem: "serve", Name: "assets_recreated_total",
			Help: "JetStream assets found missing and recreated, by kind (kv, quarantine, stream, consumer)."}, []string{"asset"}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.samples, m.bytes, m.batches, m.chunks, m.retries, m.rewinds, m.recalibrations,
		m.stageSeconds, m.imbalance, m.control, m.repliesRefused, m.dataWait, m.compute, m.assetFailures, m.stateWriteFailures, m.assetsRecreated, &stateCollector{m.s}} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *metrics) stage(st stage, d time.Duration) {
	m.nanos[st].Add(int64(d))
	m.stageSeconds.WithLabelValues(stageNames[st]).Add(d.Seconds())
}

// published counts one published micro-batch and its real samples.
func (m *metrics) published(bytes, samples int) {
	m.batches.Inc()
	m.nBat.Add(1)
	m.bytes.Add(float64(bytes))
	m.nBytes.Add(int64(bytes))
	m.samples.Add(float64(samples))
	m.nSamples.Add(int64(samples))
}

func (m *metrics) feedback(fb proto.Feedback) {
	dp, mp := strconv.Itoa(fb.DPRank), strconv.Itoa(fb.MPRank)
	m.dataWait.WithLabelValues(dp, mp).Add(fb.DataWaitSeconds)
	m.compute.WithLabelValues(dp, mp).Add(fb.ComputeSeconds)
	m.s.scaleFeedback(fb)
}

// Stats is the service's instrumentation (report.Stats, the live report's
// throughput): an alias, as bench and cmd/mmfeed name it serve.Stats.
type Stats = report.Stats

// Stats returns the instrumentation so far.
func (s *Service) Stats() Stats {
	m := s.met
	sec := func(st stage) float64 { return time.Duration(m.nanos[st].Load()).Seconds() }
	return Stats{Samples: m.nSamples.Load(), Batches: m.nBat.Load(), Chunks: m.nChunks.Load(), Bytes: m.nBytes.Load(),
		ElapsedSeconds: time.Since(m.start).Seconds(), PreprocessSeconds: sec(stagePreprocess),
		BuildSeconds: sec(stageBuild), EncodeSeconds: sec(stageEncode), PublishSeconds: sec(stagePublish)}
}

// stateCollector reports gauges read at scrape time from the service's
// memory, never from NATS: what the data plane holds (planeMetrics of its
// Gauges:
// the outbox's bytes on the core data plane, or the last snapshot of the
// stream's bytes and messages and each rank's pending and unacknowledged
// chunks on the JetStream data plane, its stream poll), positions, and
// quarantined samples by reason.
type stateCollector struct{ s *Service }

var (
	descStreamBytes = prometheus.NewDesc("mmfeed_serve_stream_bytes", "Bytes stored in the job's stream (the queue to the trainers).", nil, nil)
	descStreamMsgs  = prometheus.NewDesc("mmfeed_serve_stream_messages", "Chunk messages stored in the job's stream.", nil, nil)
	descOutboxBytes = prometheus.NewDesc("mmfeed_serve_outbox_bytes", "Bytes of built batches held in memory for the ranks (core data plane).", nil, nil)
	descPending     = prometheus.NewDesc("mmfeed_serve_rank_pending_chunks", "Chunks stored for the rank and not yet delivered.", []string{"dp", "mp"}, nil)
	descAckPending  = prometheus.NewDesc("mmfeed_serve_rank_unacked_chunks", "Chunks delivered to the rank and not yet acknowledged.", []string{"dp", "mp"}, nil)
	descNextStep    = prometheus.NewDesc("mmfeed_serve_rank_next_step", "First step (within its epoch) the rank's trainer still needs.", []string{"dp", "mp"}, nil)
	descNextEpoch   = prometheus.NewDesc("mmfeed_serve_rank_next_epoch", "Epoch of the rank's next step.", []string{"dp", "mp"}, nil)
	descQuarantined = prometheus.NewDesc("mmfeed_serve_quarantined_total", "Samples quarantined, by reason (all epochs so far).", []string{"reason"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOutboxBytes, descStreamBytes, descStreamMsgs, descPending, descAckPending, descNextStep, descNextEpoch, descQuarantined} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	if s.plane != nil {
		planeMetrics(ch, s.plane.Gauges(), s.cfg.MP)
	}
	for r, rs := range s.ranks.All() {
		l := []string{strconv.Itoa(r / s.cfg.MP), strconv.Itoa(r % s.cfg.MP)}
		ch <- prometheus.MustNewConstMetric(descNextStep, prometheus.GaugeValue, float64(rs.Next().Step), l...)
		ch <- prometheus.MustNewConstMetric(descNextEpoch, prometheus.GaugeValue, float64(rs.Next().Epoch), l...)
	}
	for reason, n := range s.live.Quarantined() {
		ch <- prometheus.MustNewConstMetric(descQuarantined, prometheus.CounterValue, float64(n), reason)
	}
}

// planeMetrics sends the gauges of what the data plane holds: the outbox's
// bytes once it is set up, or the last stream snapshot once it is polled.
func planeMetrics(ch chan<- prometheus.Metric, g deliver.PlaneGauges, mp int) {
	if g.Outbox {
		ch <- prometheus.MustNewConstMetric(descOutboxBytes, prometheus.GaugeValue, float64(g.OutboxBytes))
	}
	if g.Stream == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descStreamBytes, prometheus.GaugeValue, float64(g.Stream.Bytes))
	ch <- prometheus.MustNewConstMetric(descStreamMsgs, prometheus.GaugeValue, float64(g.Stream.Msgs))
	for r, c := range g.Stream.Ranks {
		if !c.Polled {
			continue
		}
		l := []string{strconv.Itoa(r / mp), strconv.Itoa(r % mp)}
		ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(c.Pending), l...)
		ch <- prometheus.MustNewConstMetric(descAckPending, prometheus.GaugeValue, float64(c.AckPending), l...)
	}
}
