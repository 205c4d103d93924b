package serve

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// planJob is one epoch's preparation, run once (by the publisher when it
// reaches the epoch, or ahead of it while the previous epoch is published).
type planJob struct {
	done    chan struct{}
	ep      *epochPlan
	err     error
	seconds float64 // how long preparing took
}

// prepared returns epoch e's plan, preparing it (and recording its info in
// the KV bucket) unless that is done or under way; concurrent callers share
// one preparation. A preparation that failed is tried again.
func (s *Service) prepared(ctx context.Context, e int) (*epochPlan, error) {
	s.mu.Lock()
	if ep := s.plans[e]; ep != nil {
		s.mu.Unlock()
		return ep, nil
	}
	job := s.planJobs[e]
	if job == nil || (job.err != nil && isDone(job.done)) {
		job = &planJob{done: make(chan struct{})}
		s.planJobs[e] = job
		s.mu.Unlock()
		s.runPlanJob(ctx, e, job)
	} else {
		s.mu.Unlock()
	}
	select {
	case <-job.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return job.ep, job.err
}

func isDone(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (s *Service) runPlanJob(ctx context.Context, e int, job *planJob) {
	defer close(job.done)
	s.mu.Lock()
	stored, known := s.infos[e]
	s.mu.Unlock()
	var sp *EpochInfo
	if known {
		sp = &stored
	}
	sp = s.resizeInfo(e, sp)
	t0 := time.Now()
	ep, err := prepareEpochTo(ctx, s.cfg, e, sp, s.modelFor(), s.quarantine)
	if err != nil {
		job.err = err
		return
	}
	job.seconds = time.Since(t0).Seconds()
	s.log.Info("planned epoch", "epoch", e, "steps", ep.info.Steps, "plan_hash", ep.info.PlanHash[:12],
		"quarantined", ep.prep.Quarantine.Total(), "seconds", job.seconds)
	if err := s.st.putJSON(ctx, kvEpochInfo+strconv.Itoa(e), ep.info); err != nil {
		ep.close()
		job.err = err
		return
	}
	s.mu.Lock()
	s.plans[e], s.infos[e] = ep, ep.info
	close(s.planned)
	s.planned = make(chan struct{})
	s.mu.Unlock()
	job.ep = ep
}

// epoch returns the plan of epoch e and makes it the one being published:
// recorded as the KV epoch (in the background), shown by the live report;
// plans before e-1 are released (the previous epoch stays for late
// feedback).
func (s *Service) epoch(ctx context.Context, e int) (*epochPlan, error) {
	ep, err := s.prepared(ctx, e)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	active := s.active == e
	s.mu.Unlock()
	if active {
		return ep, nil
	}
	s.ahead.Add(1)
	go func() { // informational (restore reads epoch.<e>): off the boundary's path
		defer s.ahead.Done()
		if err := s.st.putInt(ctx, proto.KVEpoch, e); err != nil && ctx.Err() == nil {
			s.log.Warn("kv", "err", err)
		}
	}()
	s.mu.Lock()
	for old, p := range s.plans {
		if old < e-1 {
			p.close()
			delete(s.plans, old)
			delete(s.planJobs, old)
		}
	}
	s.active = e
	s.mu.Unlock()
	s.live.setEpoch(ep)
	return ep, nil
}

// planAheadDue reports whether to start planning the epoch after ep once
// step (of stepsDone so far in this run, which took elapsed) is queued:
// when the rest of ep takes about four times as long to publish as
// preparing ep took, plus two steps (planning ahead competes with the
// preprocessing for the cores, and is slower than planning alone: twice was
// too little on this machine). Later is better for calibration (the next
// epoch's model sees more feedback), earlier closes the gap at the boundary.
func (s *Service) planAheadDue(ep *epochPlan, step, stepsDone int, elapsed time.Duration) bool {
	e := ep.info.Epoch
	if e >= s.cfg.lastEpoch() || stepsDone == 0 {
		return false
	}
	s.mu.Lock()
	_, started := s.planJobs[e+1]
	_, known := s.plans[e+1]
	job := s.planJobs[e]
	s.mu.Unlock()
	if started || known {
		return false
	}
	planSeconds := 1.0 // a restarted service did not time this epoch's preparation
	if job != nil && job.seconds > 0 {
		planSeconds = job.seconds
	}
	perStep := elapsed.Seconds() / float64(stepsDone)
	ahead := int(math.Ceil(4*planSeconds/max(perStep, 1e-6))) + 2
	return ep.info.Steps-(step+1) <= ahead
}

// planAhead prepares epoch e in the background, tracked by s.ahead (the
// publisher waits for it before it returns). An error is kept for the
// publisher, which meets it when it reaches e.
func (s *Service) planAhead(ctx context.Context, e int) {
	s.ahead.Add(1)
	go func() {
		defer s.ahead.Done()
		if _, err := s.prepared(ctx, e); err != nil && ctx.Err() == nil {
			s.log.Warn("planning ahead", "epoch", e, "err", err)
		}
	}()
}
