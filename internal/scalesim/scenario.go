package scalesim

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Scenario is one run of the harness at N ranks.
type Scenario struct {
	Bin     string // bin/mmfeed
	NATSBin string // nats-server
	Dir     string // scratch, created
	N       int    // ranks (dp; mp 1)
	Servers int    // 1 or 3 nats-servers
	// Steps per epoch and Epochs; PerRank samples per rank and step (the
	// global batch is N × PerRank), in MicroBatches micro-batches.
	Steps, Epochs, PerRank, MicroBatches int
	Workers                              int // worker processes (one slot each)
	// RestartNATSAt and KillLeaderAt: the global step after which the first
	// nats-server is restarted, or the leading planner killed with SIGKILL
	// (a standby planner is started then); < 0 for none.
	RestartNATSAt, KillLeaderAt int
	StepTime                    time.Duration // simulated compute per step
	// Strategy is the planner's --strategy ("" is mmfeed's default). The
	// ladder plans with random so that it measures the control plane, not
	// the balancer's search.
	Strategy string
	Log      io.Writer
}

// Figures is what a Scenario measured; Map names them for results.json.
type Figures struct {
	N                                 int
	Corpus                            int
	StartToAllFirst                   time.Duration // planner start → every rank's first batch
	FirstBatchP50, FirstBatchMax      time.Duration // from the storm's start
	RegisterP50, RegisterMax          time.Duration // the first register (waits for the plan)
	StormP50, StormMax                time.Duration // every rank's register for epoch 1 at once
	Step                              time.Duration // wall time per step, steady state
	PlannerCPUStep, NATSCPUStep       time.Duration // per step, steady state
	WorkerCPUStep                     time.Duration
	PlannerRSS, NATSRSS               int64 // peak, bytes
	KV                                map[string]float64
	KVStepRank                        map[string]float64 // KV writes per step per rank, by key kind
	OutPerStepRank, InPerStepRank     float64            // rank connections' messages
	AcksPerStepRank, FeedbackStepRank float64
	ServerMsgsStepRank                float64 // every server's in+out messages per step per rank
	Reconnect, Failover               time.Duration
	Exact                             bool
	Steps                             int
}

type snapshot struct {
	at                time.Time
	planner, nats, wk Usage
	kv                map[string]int
	varz              Varz
}

// scenarioJob is the job name every scenario serves.
const scenarioJob = "scale"

// Run runs the scenario and returns its figures; the error says what failed
// (a missing, repeated sample included).
func (sc *Scenario) Run(ctx context.Context) (*Figures, error) {
	corpus, ids, err := sc.makeCorpus(ctx)
	if err != nil {
		return nil, err
	}
	ns, err := StartNATS(sc.NATSBin, sc.Dir, sc.Servers)
	if err != nil {
		return nil, err
	}
	defer ns.Stop()
	kv, err := countKV(ns.URLs(), scenarioJob)
	if err != nil {
		return nil, err
	}
	defer kv.close()
	r := &scenarioRun{sc: sc, corpus: corpus, ns: ns, kv: kv, total: sc.Steps * sc.Epochs}
	defer r.stopAll()
	t0 := time.Now()
	if err := r.start(); err != nil {
		return nil, err
	}
	sctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go watchExit(sctx, r.leader, stop)
	res, err := Run(sctx, Config{URLs: ns.URLs(), Job: scenarioJob, DP: sc.N, Epochs: sc.Epochs, Barrier: true, StepTime: sc.StepTime, OnStep: r.onStep})
	if cause := context.Cause(sctx); err != nil && cause != nil && cause != context.Canceled {
		err = cause
	}
	r.events.Wait()
	if err == nil {
		err = r.eventErr
	}
	if err != nil {
		return nil, fmt.Errorf("scalesim: N=%d: %w (logs in %s)", sc.N, err, sc.Dir)
	}
	f := sc.figures(res, ids, t0, r.first, r.last)
	if err := r.eventFigures(f, res); err != nil {
		return f, err
	}
	if err := res.Check(ids, sc.Epochs); err != nil {
		return f, err
	}
	f.Exact = true
	return f, nil
}

// makeCorpus synthesizes the scenario's corpus in sc.Dir and returns its
// path with the ids of its manifest.
func (sc *Scenario) makeCorpus(ctx context.Context) (string, []string, error) {
	if err := os.MkdirAll(sc.Dir, 0o755); err != nil {
		return "", nil, err
	}
	samples := sc.N * sc.PerRank * sc.Steps
	corpus := filepath.Join(sc.Dir, "corpus")
	if out, err := exec.CommandContext(ctx, sc.Bin, "synth", "--out", corpus, "--samples", strconv.Itoa(samples),
		"--skew", "none", "--seed", "1").CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("scalesim: synth: %v: %s", err, out)
	}
	ids, err := manifestIDs(filepath.Join(corpus, "manifest.jsonl"))
	return corpus, ids, err
}

// scenarioRun is one Run's processes and what its step events record; mu
// guards the snapshots, the event fields and procs.
type scenarioRun struct {
	sc      *Scenario
	corpus  string
	ns      *NATS
	kv      *kvCounter
	total   int // steps over every epoch
	leader  *Proc
	workers []*Proc

	mu            sync.Mutex
	procs         []*Proc
	first, last   snapshot
	beforeRestart snapshot // the servers' usage just before the restart
	eventAt       time.Time
	eventStep     int
	eventErr      error
	events        sync.WaitGroup
}

// start starts the leading planner and the workers.
func (r *scenarioRun) start() error {
	leader, err := r.planner("planner-a")
	if err != nil {
		return err
	}
	r.leader = leader
	for i := range r.sc.Workers {
		url := r.ns.URLs()[i%len(r.ns.URLs())]
		p, err := Start(fmt.Sprintf("worker-%d", i), filepath.Join(r.sc.Dir, fmt.Sprintf("worker-%d.log", i)),
			r.sc.Bin, "serve", "--role", "worker", "--nats", url, "--slots", "1")
		if err != nil {
			return err
		}
		r.add(p)
		r.workers = append(r.workers, p)
	}
	return nil
}

// planner starts a planner process named name.
func (r *scenarioRun) planner(name string) (*Proc, error) {
	sc := r.sc
	p, err := Start(name, filepath.Join(sc.Dir, name+".log"), sc.Bin, "serve", "--role", "planner",
		"--input", filepath.Join(r.corpus, "manifest.jsonl"), "--dp", strconv.Itoa(sc.N),
		"--global-batch", strconv.Itoa(sc.N*sc.PerRank), "--micro-batches", strconv.Itoa(sc.MicroBatches),
		"--image-size", "32", "--seed", "5", "--job", scenarioJob, "--epochs", strconv.Itoa(sc.Epochs),
		"--recalibrate", "-1", "--nats", strings.Join(r.ns.URLs(), ","), "--replicas", strconv.Itoa(sc.Servers),
		"--lease-ttl", "3s", "--data-dir", filepath.Join(sc.Dir, name), "--http", "",
		"--strategy", cmp.Or(sc.Strategy, "mmfeed"), "--report-baselines=false")
	if err == nil {
		r.add(p)
	}
	return p, err
}

func (r *scenarioRun) add(p *Proc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.procs = append(r.procs, p)
}

func (r *scenarioRun) stopAll() {
	r.mu.Lock()
	procs := r.procs
	r.mu.Unlock()
	for _, p := range procs {
		p.Stop(10 * time.Second)
	}
}

// usage is a snapshot of the planner's, the servers' and the workers' usage.
func (r *scenarioRun) usage() snapshot {
	s := snapshot{at: time.Now(), planner: r.leader.Usage(), nats: r.ns.Usage(), kv: r.kv.counts(), varz: r.ns.Varz()}
	for _, w := range r.workers {
		x := w.Usage()
		s.wk.CPU += x.CPU
	}
	return s
}

// onStep is the rank simulator's step callback: it snapshots the first and
// last steps and sets off the scenario's events.
func (r *scenarioRun) onStep(epoch, step, g int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch g {
	case 0:
		r.first = r.usage()
	case r.total - 1:
		r.last = r.usage()
	}
	if g == r.sc.RestartNATSAt || g == r.sc.KillLeaderAt {
		r.eventAt, r.eventStep = time.Now(), g
		r.events.Add(1)
		go r.event(g)
	}
	if r.sc.KillLeaderAt >= 0 && g == 0 {
		r.events.Add(1)
		go func() { // the standby, started once the leader leads
			defer r.events.Done()
			if _, err := r.planner("planner-b"); err != nil {
				r.mu.Lock()
				r.eventErr = err
				r.mu.Unlock()
			}
		}()
	}
}

// event restarts the first NATS server or kills the leading planner after
// step g.
func (r *scenarioRun) event(g int) {
	defer r.events.Done()
	var err error
	if g == r.sc.RestartNATSAt {
		r.mu.Lock()
		r.beforeRestart = r.usage()
		r.mu.Unlock()
		r.sc.logf("restarting nats-server 0 after step %d", g)
		err = r.ns.Restart(0)
	} else {
		r.sc.logf("kill -9 of the leading planner after step %d", g)
		r.leader.killed.Store(true)
		r.leader.Kill9()
	}
	r.mu.Lock()
	r.eventErr = err
	r.mu.Unlock()
}

// eventFigures adds to f the servers' figures before a restart and the
// time the ranks took to receive again after the event.
func (r *scenarioRun) eventFigures(f *Figures, res *Result) error {
	sc, first, before := r.sc, r.first, r.beforeRestart
	if sc.RestartNATSAt > 0 && !before.at.IsZero() {
		// The servers' CPU and messages over the steps before the restart.
		steps := time.Duration(sc.RestartNATSAt)
		f.NATSCPUStep = (before.nats.CPU - first.nats.CPU) / steps
		f.ServerMsgsStepRank = float64(before.varz.InMsgs+before.varz.OutMsgs-first.varz.InMsgs-first.varz.OutMsgs) /
			float64(sc.RestartNATSAt*sc.N)
		f.NATSRSS = before.nats.PeakRSS
	}
	if r.eventAt.IsZero() {
		return nil
	}
	// A rank holds up to its fetch window (4 batches) asked for before
	// the event: count a batch of a step past that.
	ahead := (4 + sc.MicroBatches - 1) / sc.MicroBatches
	g := r.eventStep + 1 + ahead
	d, ok := res.ReceivesAgain(r.eventAt, g/sc.Steps, g%sc.Steps)
	if !ok {
		return fmt.Errorf("scalesim: N=%d: some rank never received again after the event", sc.N)
	}
	if sc.RestartNATSAt >= 0 {
		f.Reconnect = d
	} else {
		f.Failover = d
	}
	return nil
}

func (sc *Scenario) figures(res *Result, ids []string, t0 time.Time, first, last snapshot) *Figures {
	f := &Figures{N: sc.N, Corpus: len(ids), Steps: len(res.StepsDone), KV: map[string]float64{}, KVStepRank: map[string]float64{}}
	fb := res.FirstBatch()
	if len(fb) > 0 {
		f.FirstBatchP50, f.FirstBatchMax = Quantile(fb, 0.5), fb[len(fb)-1]
		f.StartToAllFirst = res.Start.Add(f.FirstBatchMax).Sub(t0)
	}
	reg := append([]time.Duration(nil), res.Registered...)
	sortDurations(reg)
	f.RegisterP50, f.RegisterMax = Quantile(reg, 0.5), reg[len(reg)-1]
	if sc.Epochs > 1 {
		again := append([]time.Duration(nil), res.RegisteredAgain...)
		sortDurations(again)
		f.StormP50, f.StormMax = Quantile(again, 0.5), again[len(again)-1]
	}
	steps := max(1, f.Steps-1) // between the first and the last step's barrier
	per := func(d time.Duration) time.Duration { return d / time.Duration(steps) }
	f.Step = per(last.at.Sub(first.at))
	f.PlannerCPUStep = per(last.planner.CPU - first.planner.CPU)
	if sc.RestartNATSAt < 0 {
		f.NATSCPUStep = per(last.nats.CPU - first.nats.CPU)
	}
	f.WorkerCPUStep = per(last.wk.CPU - first.wk.CPU)
	f.PlannerRSS, f.NATSRSS = last.planner.PeakRSS, last.nats.PeakRSS
	rs := float64(steps * sc.N)
	for k, v := range last.kv {
		f.KV[k] = float64(v)
		f.KVStepRank[k] = float64(v-first.kv[k]) / rs
	}
	all := float64(f.Steps * sc.N)
	f.OutPerStepRank = float64(res.OutMsgs) / all
	f.InPerStepRank = float64(res.InMsgs) / all
	f.AcksPerStepRank = float64(res.Acks) / all
	f.FeedbackStepRank = float64(res.Feedbacks) / all
	if sc.RestartNATSAt < 0 {
		f.ServerMsgsStepRank = float64(last.varz.InMsgs+last.varz.OutMsgs-first.varz.InMsgs-first.varz.OutMsgs) / rs
	}
	return f
}

// Map returns the figures under results.json keys with prefix (scale_n64_).
func (f *Figures) Map(prefix string) map[string]float64 {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	m := map[string]float64{
		"start_to_all_first_batch_ms": ms(f.StartToAllFirst),
		"storm_first_batch_p50_ms":    ms(f.FirstBatchP50), "storm_first_batch_max_ms": ms(f.FirstBatchMax),
		"register_p50_ms": ms(f.RegisterP50), "register_max_ms": ms(f.RegisterMax),
		"register_storm_p50_ms": ms(f.StormP50), "register_storm_max_ms": ms(f.StormMax),
		"step_ms": ms(f.Step), "planner_cpu_ms_per_step": ms(f.PlannerCPUStep),
		"worker_cpu_ms_per_step": ms(f.WorkerCPUStep),
		"planner_peak_rss_mb":    float64(f.PlannerRSS) / (1 << 20), "nats_peak_rss_mb": float64(f.NATSRSS) / (1 << 20),
		"rank_msgs_out_per_step_rank": f.OutPerStepRank, "rank_msgs_in_per_step_rank": f.InPerStepRank,
		"acks_per_step_rank": f.AcksPerStepRank, "exactly_once": b2f(f.Exact), "steps": float64(f.Steps),
	}
	if f.NATSCPUStep > 0 {
		m["nats_cpu_ms_per_step"] = ms(f.NATSCPUStep)
		m["server_msgs_per_step_rank"] = f.ServerMsgsStepRank
	}
	total := 0.0
	for k, v := range f.KVStepRank {
		m["kv_"+k+"_writes_per_step_rank"] = v
		total += v
	}
	m["kv_writes_per_step_rank"] = total
	if f.Reconnect > 0 {
		m["nats_restart_all_receive_ms"] = ms(f.Reconnect)
	}
	if f.Failover > 0 {
		m["failover_all_receive_ms"] = ms(f.Failover)
	}
	if f.Failover > 0 { // the leader was killed: its usage stops there
		delete(m, "planner_cpu_ms_per_step")
		delete(m, "planner_peak_rss_mb")
	}
	out := map[string]float64{}
	for k, v := range m {
		out[prefix+k] = v
	}
	return out
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (sc *Scenario) logf(format string, a ...any) {
	if sc.Log != nil {
		fmt.Fprintf(sc.Log, "scale N=%d: "+format+"\n", append([]any{sc.N}, a...)...)
	}
}

func manifestIDs(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ids []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("scalesim: %s: %w", path, err)
		}
		ids = append(ids, r.ID)
	}
	return ids, sc.Err()
}

// watchExit cancels the run when p exits with an error it was not killed
// for (a planner that failed to start).
func watchExit(ctx context.Context, p *Proc, stop context.CancelCauseFunc) {
	select {
	case <-ctx.Done():
	case <-p.done:
		if p.err != nil && !p.killed.Load() {
			stop(fmt.Errorf("scalesim: %s exited: %v: %s", p.Name, p.err, tail(p.Log, 400)))
		}
	}
}

// tail returns the last n bytes of a file.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	return string(b[max(0, len(b)-n):])
}
