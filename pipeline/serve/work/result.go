package work

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"

	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/nats-io/nats.go"
)

// ItemMaxFailures is how many failure reports of one item (feature or
// batch) the planner takes before it gives up on the item and fails the job
// with the workers' reason (ErrWorkFailed). An item fails for what is
// outside its samples (a sample that cannot be decoded is quarantined and
// does not fail its item): the input unreachable from the workers, another
// dataset at the path; waiting would never end.
const ItemMaxFailures = 5

// ErrWorkFailed: the workers failed one item ItemMaxFailures times; the
// error carries their last reason.
var ErrWorkFailed = errors.New("work item failed on the workers")

// rejectCounts counts the results that did not match their item, by
// reason: every one of RejectReasons from the start. Safe for
// concurrent use; its lock is a leaf.
type rejectCounts struct {
	mu sync.Mutex
	n  map[string]int64
}

func newRejectCounts() *rejectCounts {
	c := &rejectCounts{n: map[string]int64{}}
	for _, r := range RejectReasons {
		c.n[r] = 0
	}
	return c
}

// inc counts one rejected result.
func (c *rejectCounts) inc(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[reason]++
}

// snapshot returns the counts now.
func (c *rejectCounts) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// handleResult takes one message of a worker's batch result: a chunk, the
// done message or a failure report. A reassembled payload is verified
// against the item it answers before it is kept (VerifyResult); one that
// does not match is counted, dropped, and its item issued again.
func (w *Planner) handleResult(m *nats.Msg) {
	if !w.replyOK(m) {
		return // its answer would go elsewhere than a worker's inbox: not taken
	}
	id := m.Header.Get(HdrItem)
	if m.Header.Get(HdrDone) != "" {
		w.handleDone(m, id)
		return
	}
	if reason := m.Header.Get(HdrError); reason != "" {
		w.failed(id, reason)
		return
	}
	a, err := w.asm.Add(m.Header, m.Data, struct{}{})
	if err != nil || a == nil || a.Payload == nil {
		if err != nil {
			w.log.Debug("work result chunk", "item", id, "err", err)
		}
		return
	}
	k := a.Header.BatchKey
	key := Key{Epoch: k.Epoch, Step: k.Step, DP: k.DPRank, MicroBatch: k.MicroBatch}
	w.mu.Lock()
	sl := w.slots[key]
	if sl == nil || sl.id != id || k.Job != w.job || k.MPRank < 0 || k.MPRank >= w.mp || sl.payloads[k.MPRank] != nil {
		w.mu.Unlock()
		w.duplicates.Add(1) // an item no longer wanted, a stale one, or a second worker's result
		return
	}
	it, shapes := sl.item, sl.shapes
	w.mu.Unlock()
	verr := VerifyResult(it, shapes, k.MPRank, m.Header.Get(HdrConfig), a.Payload)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.slots[key] != sl || sl.payloads[k.MPRank] != nil {
		w.duplicates.Add(1) // reset, forgotten or filled meanwhile
		return
	}
	if verr != nil {
		w.rejectLocked(sl, k.MPRank, verr)
		return
	}
	sl.payloads[k.MPRank] = a.Payload
	if sl.have++; sl.have == w.mp { // the publisher may take it (and forget the slot) before the done message
		w.results.Add(1)
		w.timing[id] = sl.cost
		w.wakeLocked()
	}
}

// rejectLocked counts and logs a result that does not match its item and
// marks the item to be issued again. The caller holds w.mu.
func (w *Planner) rejectLocked(sl *workSlot, mp int, err error) {
	reason := RejectDecode
	var re *ResultError
	if errors.As(err, &re) {
		reason = re.Reason()
	}
	w.rejects.inc(reason)
	sl.rejects++
	sl.lastReject = Truncate(err.Error(), MaxReasonBytes)
	sl.reissue = true
	it := sl.item
	w.log.Warn("work result rejected: it does not match the item issued; the item is issued again", "item", it.ID,
		"epoch", it.Epoch, "step", it.Step, "dp", it.DP, "mb", it.MicroBatch, "mp", mp, "reason", reason,
		"detail", sl.lastReject, "rejected", sl.rejects)
	w.wakeLocked()
}

// failed records a worker's failure report of a batch item.
func (w *Planner) failed(id, reason string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, sl := range w.slots {
		if sl.id != id || sl.have == w.mp {
			continue
		}
		sl.failures++
		w.failureReports.Add(1)
		sl.lastFailure = Truncate(reason, MaxReasonBytes)
		it := sl.item
		w.log.Warn("work item failed on a worker", "item", id, "epoch", it.Epoch, "step", it.Step, "dp", it.DP,
			"mb", it.MicroBatch, "failures", sl.failures, "max", ItemMaxFailures, "reason", sl.lastFailure)
		w.wakeLocked()
		return
	}
}

// wakeLocked wakes every wait. The caller holds w.mu.
func (w *Planner) wakeLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// ReissueRejected publishes again every item a result was rejected for
// since it was last published.
func (w *Planner) ReissueRejected(ctx context.Context) error {
	var raw [][]byte
	w.mu.Lock()
	for _, sl := range w.slots {
		if sl.reissue && sl.have < w.mp {
			sl.reissue = false
			raw = append(raw, sl.raw)
		}
	}
	w.mu.Unlock()
	for _, b := range raw {
		if err := w.publish(ctx, b); err != nil {
			return fmt.Errorf("serve: issue a rejected work item again: %w", err)
		}
		w.reissued.Add(1)
	}
	return nil
}

// handleDone answers a worker's done message: ok when the planner holds the
// item's payloads (or no longer needs them), rejected when a result of it
// was rejected and the item is to be issued again (the worker acknowledges
// its copy), missing when chunks were lost.
func (w *Planner) handleDone(m *nats.Msg, id string) {
	secs, _ := strconv.ParseFloat(m.Header.Get(HdrSeconds), 64)
	answer := AnswerOK
	w.mu.Lock()
	if cost, ok := w.timing[id]; ok {
		delete(w.timing, id)
		w.observe(cost, secs)
		w.scale.itemDone(secs, natsenv.ReplyPrefix(m.Reply), workerSlots(m.Header.Get(HdrSlots)))
	} else {
		for _, sl := range w.slots {
			if sl.id == id && sl.have < w.mp {
				answer = AnswerMissing // chunks were lost: the worker sends them again
				if sl.reissue {
					answer = AnswerRejected + " " + sl.lastReject
				}
				break
			}
		}
	}
	w.mu.Unlock()
	_ = m.Respond([]byte(answer))
}

// ResultInboxes are the inbox prefixes a work result may be answered on: a
// worker's own, and the service's for its local workers (which share its
// connection).
func ResultInboxes() []string { return []string{WorkerInboxPrefix, natsenv.ServiceInboxPrefix} }

// workerReply is the planner's reply check before GuardReplies (the shard
// command's planner): a result is answered only on a worker's inbox or the
// planner's own connection's (natsenv.CheckReply).
func workerReply(m *nats.Msg) bool {
	return m.Reply == "" || natsenv.CheckReply(m.Reply, false, ResultInboxes()...) == ""
}

// GuardReplies makes ok the check of every result's reply subject, batch
// and feature results alike: a result whose answer would go elsewhere is
// dropped before it is read (serve's reply guard, control.Guard.WorkReplyOK, counts and logs it).
func (w *Planner) GuardReplies(ok func(*nats.Msg) bool) {
	w.replyOK, w.feats.replyOK = ok, ok
}
