package balancer

import "sync"

// alternatives are the candidates bestCandidate weighs against the refined
// length-sorted grouping; nil where a candidate does not apply or breaks the
// budget.
type alternatives struct {
	balance   [][]int32 // balanceFirst
	lengthPos [][]int32 // positionsFirst over the grouping's order
	costPos   [][]int32 // positionsFirst over the cost order
}

// pending is a set of candidates under construction; wait returns them once
// all are built.
type pending struct {
	wg   sync.WaitGroup
	alts alternatives
}

// wait blocks until every candidate started is built and returns them.
func (w *pending) wait() alternatives {
	w.wg.Wait()
	return w.alts
}

// run calls f on another goroutine when parallel, else now.
func (w *pending) run(parallel bool, f func()) {
	if !parallel {
		f()
		return
	}
	w.wg.Go(f)
}

// positionsApply reports whether the positionsFirst candidates apply: the
// ranks meet at every micro-batch and there are several.
func (jb *job) positionsApply() bool {
	return jb.cfg.Sync == SyncMicroBatch && jb.cfg.MicroBatches > 1
}

// parallel reports whether this batch builds its candidates concurrently.
func (jb *job) parallel() bool { return !jb.sequential && len(jb.items) >= parallelMinItems }

// startIndependent starts the candidates that do not depend on the grouping:
// balanceFirst (below balanceFirstLimit items) and positionsFirst over the
// cost order. They only read the
// items, costs and configuration, so they run beside the refinement.
func (jb *job) startIndependent(w *pending) {
	par := jb.parallel()
	if jb.positionsApply() {
		subs := jb.subPartitioners()
		w.run(par, func() { w.alts.costPos = jb.positionsFirst(jb.byCostOrder(), subs) })
	}
	if len(jb.items) < balanceFirstLimit {
		w.run(par, func() { w.alts.balance = jb.balanceFirst() })
	}
}

// startGrouped starts positionsFirst over order (the chosen grouping's).
func (jb *job) startGrouped(w *pending, order []int32) {
	if jb.positionsApply() {
		subs := jb.subPartitioners()
		w.run(jb.parallel(), func() { w.alts.lengthPos = jb.positionsFirst(order, subs) })
	}
}

// subPartitioners returns positionsFirst's sub-partitioners, one per
// micro-batch position so that the chunks can be split concurrently: the
// same ranks, budget, placement and model, one micro-batch per rank, and a
// smaller exact-grouping limit (tuning.subDPLimit).
func (jb *job) subPartitioners() []*Partitioner {
	cfg := jb.cfg
	cfg.MicroBatches, cfg.Sync = 1, SyncStep
	subs := make([]*Partitioner, jb.cfg.MicroBatches)
	for i := range subs {
		subs[i] = &Partitioner{cfg: cfg, model: jb.model, total: jb.total, dpLimit: subDPLimit,
			sequential: jb.sequential, fullPricing: jb.fullPricing, sub: true}
	}
	return subs
}
