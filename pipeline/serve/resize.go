package serve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/mmfeed/mmfeed/internal/ctxutil"
	"github.com/mmfeed/mmfeed/proto"
)

// Elastic resume: a job recorded at dp = N served by a service started with
// another dp and AllowResize. Nothing changes until the first trainer rank
// of the new layout registers: its (epoch, resume step), the position of the
// checkpoint the trainers resume from, is the resize point. From it on the
// epoch is a new plan of the samples the old plan had not reached yet, for
// the new dp (balancer.Plan.Resize), recorded in the epoch's info
// (EpochInfo.Resize) so that a restarted service replays it; later epochs
// are planned for the new dp from scratch. Steps keep their numbers: the
// trainers' global position (epoch, next step) is valid on both sides of
// the resize, and every sample of the epoch is trained once across it.
// An epoch is resized once: a second resize inside an epoch already resized
// is refused (ErrResizeTwice) before anything is written; at the epoch's end
// (a register at its last step + 1) it resizes the next epoch.

// ErrResizeTwice: a register of a new layout would resize an epoch that was
// resized already (EpochInfo records one resize per epoch). Nothing is
// changed; the job stays at the dp it was resized to.
var ErrResizeTwice = errors.New("serve: a second resize within an epoch")

// pendingResize is a resize accepted at start and decided by the first
// register of the new layout.
type pendingResize struct {
	// mu serialises decideResize: ranks register concurrently.
	mu      sync.Mutex
	oldDP   int
	decided chan struct{} // closed once point is set
	point   proto.Pos     // the resize point, normalised (after decided)
	base    *EpochInfo    // the point epoch's info at the old dp (nil: not planned before)
}

// checkResize accepts a stored job record with another dp when AllowResize
// is set and the record matches this configuration at the stored dp. It
// returns whether a resize is pending (the new record is written once it is
// decided).
func (s *Service) checkResize(rec, stored JobRecord) (bool, error) {
	if stored.DP == rec.DP {
		return false, nil
	}
	at, err := s.cfg.jobRecordAt(stored.DP)
	if err != nil {
		return false, err
	}
	if at.compatible(stored) != nil {
		return false, nil // something besides dp differs: compatible reports it
	}
	if !s.cfg.AllowResize {
		return false, fmt.Errorf("serve: job %s runs at dp=%d, this service has dp=%d: start it with --allow-resize to replan the rest of the epoch for dp=%d (the trainers resume with --allow-resize): %w",
			stored.Job, stored.DP, rec.DP, rec.DP, ErrJobMismatch)
	}
	if err := s.plane.Resizable(stored.Job, stored.DP, rec.DP); err != nil {
		return false, err
	}
	s.resize = &pendingResize{oldDP: stored.DP, decided: make(chan struct{})}
	s.log.Info("resize accepted: waiting for the first trainer rank of the new layout to name the resize point",
		"from_dp", stored.DP, "to_dp", rec.DP)
	return true, nil
}

// decideResize makes (epoch, step) of a register of the new layout the
// resize point when none is set yet; later registers must not ask for a
// step before it (those steps were planned for the old dp).
func (s *Service) decideResize(ctx context.Context, epoch, step int) error {
	r := s.resize
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctxutil.Closed(r.decided) {
		point := r.point
		if (proto.Pos{Epoch: epoch, Step: step}).Less(point) && !(proto.Pos{Epoch: epoch, Step: step} == proto.Pos{Epoch: point.Epoch - 1, Step: r.baseSteps()}) {
			return fmt.Errorf("serve: register at epoch %d step %d: the job was resized to dp=%d at epoch %d step %d; earlier steps were planned for dp=%d: %w",
				epoch, step, s.cfg.Pipeline.Plan.DP, point.Epoch, point.Step, r.oldDP, proto.ErrControl)
		}
		return nil
	}
	// Read what the decision needs, write the KV bucket, and only then change
	// the service's state: a failed decision leaves nothing half done.
	point := proto.Pos{Epoch: epoch, Step: step}
	infos := s.epochs.AllInfos()
	info, planned := infos[epoch]
	var stale []int
	for e := range infos {
		if e >= epoch {
			stale = append(stale, e)
		}
	}
	var base *EpochInfo
	switch {
	case planned:
		base = &info
		if step >= info.Steps {
			point = proto.Pos{Epoch: epoch + 1, Step: 0}
			stale = slices.DeleteFunc(stale, func(e int) bool { return e == epoch })
		} else if r := info.Resize; r != nil {
			return fmt.Errorf("%w: epoch %d was resized from dp=%d to dp=%d at step %d, and a resize to dp=%d at step %d would plan it a third time; one resize per epoch: resume at dp=%d until the epoch ends (register at step %d), then resize: %w",
				ErrResizeTwice, epoch, info.DP, r.DP, r.FromStep, s.cfg.Pipeline.Plan.DP, step, r.DP, info.Steps, proto.ErrControl)
		}
	case step > 0:
		return fmt.Errorf("serve: register at epoch %d step %d: the job has no record of epoch %d, so the samples its first %d steps held are unknown: %w",
			epoch, step, epoch, step, proto.ErrControl)
	}
	// Epochs from the point's on are planned again (for the new dp): forget
	// their old-dp infos, in the KV bucket and here.
	if err := s.epochs.Unrecord(ctx, stale); err != nil {
		return fmt.Errorf("serve: resize: %w", err)
	}
	rec, err := s.cfg.jobRecord()
	if err != nil {
		return err
	}
	if err := s.st.putJSON(ctx, proto.KVConfig, rec); err != nil {
		return err
	}
	s.epochs.Forget(stale)
	s.ranks.ResetAll(point)
	r.point, r.base = point, base
	close(r.decided)
	s.log.Info("resized", "from_dp", r.oldDP, "to_dp", s.cfg.Pipeline.Plan.DP, "epoch", point.Epoch, "from_step", point.Step)
	return nil
}

// baseSteps is the old-dp step count of the epoch before the point when the
// point is an epoch's start reached by normalising (a register at its end).
func (r *pendingResize) baseSteps() int {
	if r.base != nil && r.point.Epoch == r.base.Epoch+1 {
		return r.base.Steps
	}
	return -1
}

// awaitResize blocks the publisher until a pending resize is decided.
func (s *Service) awaitResize(ctx context.Context) error {
	if s.resize == nil {
		return nil
	}
	select {
	case <-s.resize.decided:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// resizeInfo returns the stored info to replay epoch e with: at the resize
// point's epoch, its old-dp info with the resize segment (nil when that
// epoch was not planned before: it is planned for the new dp alone).
func (s *Service) resizeInfo(e int, stored *EpochInfo) *EpochInfo {
	r := s.resize
	if r == nil || !ctxutil.Closed(r.decided) || e != r.point.Epoch || r.base == nil || r.base.Epoch != e {
		return stored
	}
	info := *r.base
	if info.DP == 0 {
		info.DP = r.oldDP
	}
	info.Resize = &ResizeSegment{FromStep: r.point.Step, DP: s.cfg.Pipeline.Plan.DP, Segments: len(info.Segments)}
	return &info
}
