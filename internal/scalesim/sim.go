package scalesim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/proto"
	"golang.org/x/sync/errgroup"
)

// Config configures Run.
type Config struct {
	URLs []string // the NATS servers
	Job  string
	DP   int // the ranks (mp is 1)
	// Epochs is the trainers' epoch count: after it they stop without
	// registering again (0: until a register is refused as past the end).
	Epochs int
	// Barrier makes the ranks meet after every step (the all-reduce).
	Barrier bool
	// StepTime is each rank's simulated compute per step.
	StepTime time.Duration
	// OnStep, when set, is called by the last rank to reach the barrier of
	// every step (epoch, step, the global step index from 0), before the
	// ranks go on: events injected there happen with every rank between
	// steps. Barrier only.
	OnStep func(epoch, step, global int)
}

// Result is what Run measured.
type Result struct {
	Start      time.Time       // when the ranks started registering (all at once)
	Registered []time.Duration // per rank: its first register's latency
	// RegisteredAgain: per rank, its register for epoch 1 (all ranks at
	// once at the epoch boundary, the epoch planned ahead): the storm alone.
	RegisteredAgain []time.Duration
	Recv            [][]received // per rank: every batch, in order
	StepsDone       []time.Time  // when every rank had finished each global step
	// Sent per kind, all ranks: register requests (attempts), acks,
	// feedbacks, dones; OutMsgs and InMsgs are the connections' own counts
	// (fetches and re-asks are OutMsgs minus the rest; InMsgs is mostly
	// chunks).
	Registers, Acks, Feedbacks, Dones int
	OutMsgs, InMsgs                   uint64
	Reconnects                        uint64
	// Delivered counts each sample id of weight > 0 per epoch.
	Delivered []map[string]int
}

type sim struct {
	cfg Config

	mu        sync.Mutex
	delivered []map[string]int
	arrived   int
	release   chan struct{}
	global    int
	stepsDone []time.Time
}

// Run starts cfg.DP ranks at once, runs them to the end of the job (a
// register past the last epoch) and returns what they measured; the error
// is the first rank's that failed (ctx bounds everything).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	s := &sim{cfg: cfg, release: make(chan struct{})}
	ranks := make([]*rank, cfg.DP)
	for i := range ranks {
		ranks[i] = &rank{dp: i, sim: s}
	}
	connect, cctx := errgroup.WithContext(ctx)
	connect.SetLimit(64)
	for _, r := range ranks {
		connect.Go(func() error { return r.connect(cctx) })
	}
	err := connect.Wait()
	defer func() {
		for _, r := range ranks {
			if r.nc != nil {
				r.nc.Close()
			}
		}
	}()
	if err != nil {
		return nil, err
	}
	res := &Result{Start: time.Now()}
	g, gctx := errgroup.WithContext(ctx)
	for _, r := range ranks {
		g.Go(func() error { return r.run(gctx) })
	}
	err = g.Wait()
	for _, r := range ranks {
		res.Registered = append(res.Registered, r.registered)
		res.RegisteredAgain = append(res.RegisteredAgain, r.again)
		res.Recv = append(res.Recv, r.recv)
		res.Registers += r.registers
		res.Acks += r.acks
		res.Feedbacks += r.feedbacks
		res.Dones += r.dones
		st := r.nc.Stats()
		res.OutMsgs += st.OutMsgs
		res.InMsgs += st.InMsgs
		res.Reconnects += st.Reconnects
	}
	s.mu.Lock()
	res.Delivered, res.StepsDone = s.delivered, s.stepsDone
	s.mu.Unlock()
	return res, err
}

// deliver counts the rows of weight > 0 of one batch and returns how many.
func (s *sim) deliver(epoch int, rows []proto.Row) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.delivered) <= epoch {
		s.delivered = append(s.delivered, map[string]int{})
	}
	n := 0
	for _, row := range rows {
		if row.Weight > 0 {
			s.delivered[epoch][row.ID]++
			n++
		}
	}
	return n
}

// meet waits until every rank reached this step's barrier (Barrier), the
// last one running OnStep first.
func (s *sim) meet(ctx context.Context, epoch, step int) error {
	if !s.cfg.Barrier {
		return nil
	}
	s.mu.Lock()
	ch := s.release
	s.arrived++
	if s.arrived < s.cfg.DP {
		s.mu.Unlock()
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.arrived, s.release = 0, make(chan struct{})
	g := s.global
	s.global++
	s.stepsDone = append(s.stepsDone, time.Now())
	s.mu.Unlock()
	if s.cfg.OnStep != nil {
		s.cfg.OnStep(epoch, step, g)
	}
	close(ch)
	return nil
}

// Check returns an error unless every id of want was delivered exactly once
// in each of epochs epochs, and nothing else was.
func (r *Result) Check(want []string, epochs int) error {
	if len(r.Delivered) != epochs {
		return fmt.Errorf("scalesim: samples delivered in %d epochs, want %d", len(r.Delivered), epochs)
	}
	var errs []error
	for e, got := range r.Delivered {
		missing, repeated, extra := 0, 0, 0
		for _, id := range want {
			switch got[id] {
			case 0:
				missing++
			case 1:
			default:
				repeated++
			}
		}
		extra = len(got) - (len(want) - missing)
		if missing+repeated+extra > 0 {
			errs = append(errs, fmt.Errorf("scalesim: epoch %d: %d samples missing, %d repeated, %d not in the corpus (of %d)", e, missing, repeated, extra, len(want)))
		}
	}
	return errors.Join(errs...)
}

// FirstBatch returns every rank's time from Start to its first batch,
// sorted.
func (r *Result) FirstBatch() []time.Duration {
	var out []time.Duration
	for _, rv := range r.Recv {
		if len(rv) > 0 {
			out = append(out, rv[0].at.Sub(r.Start))
		}
	}
	slices.Sort(out)
	return out
}

// ReceivesAgain returns how long after t every rank had received a batch of
// a step at or after (epoch, step): the batches a rank had in its window
// at t do not count. ok is false when some rank never did.
func (r *Result) ReceivesAgain(t time.Time, epoch, step int) (time.Duration, bool) {
	var worst time.Duration
	for _, rv := range r.Recv {
		i := sort.Search(len(rv), func(i int) bool {
			return rv[i].epoch > epoch || (rv[i].epoch == epoch && rv[i].step >= step)
		})
		if i == len(rv) {
			return 0, false
		}
		worst = max(worst, rv[i].at.Sub(t))
	}
	return worst, true
}

// Quantile returns the q-quantile (0..1) of sorted ds.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}
