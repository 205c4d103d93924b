package balancer

import "sync"

// parallelMinItems is the batch size from which Partition builds its
// alternative candidates (balanceFirst, positionsFirst) on other goroutines
// while it refines the length-sorted grouping, and positionsFirst splits its
// chunks concurrently. Below it the goroutines cost more than they save. The
// candidates and the choice among them are the same either way, so the plan
// does not depend on the number of cores.
const parallelMinItems = 1024

// subDPLimit is dpGroupingLimit for positionsFirst's sub-partitioners.
const subDPLimit = dpGroupingLimit / 8

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
func (p *Partitioner) positionsApply() bool {
	return p.cfg.Sync == SyncMicroBatch && p.cfg.MicroBatches > 1
}

// parallel reports whether this batch builds its candidates concurrently.
func (p *Partitioner) parallel() bool { return !p.sequential && len(p.items) >= parallelMinItems }

// startIndependent starts the candidates that do not depend on the grouping:
// balanceFirst and positionsFirst over the cost order. They only read the
// items, costs and configuration, so they run beside the refinement.
func (p *Partitioner) startIndependent(w *pending) {
	par := p.parallel()
	if p.positionsApply() {
		subs := p.subPartitioners(1)
		w.run(par, func() { w.alts.costPos = p.positionsFirst(p.byCostOrder(), subs) })
	}
	w.run(par, func() { w.alts.balance = p.balanceFirst() })
}

// startGrouped starts positionsFirst over order (the chosen grouping's).
func (p *Partitioner) startGrouped(w *pending, order []int32) {
	if p.positionsApply() {
		subs := p.subPartitioners(0)
		w.run(p.parallel(), func() { w.alts.lengthPos = p.positionsFirst(order, subs) })
	}
}

// subPartitioners returns positionsFirst's sub-partitioners for candidate i
// (0: grouping order, 1: cost order), one per micro-batch position so that
// the chunks can be split concurrently: the same ranks, budget, placement
// and model, one micro-batch per rank. Nil when they cannot be built.
func (p *Partitioner) subPartitioners(i int) []*Partitioner {
	if len(p.subs[i]) == p.cfg.MicroBatches {
		return p.subs[i]
	}
	cfg := p.cfg
	cfg.MicroBatches, cfg.Sync = 1, SyncStep
	subs := make([]*Partitioner, p.cfg.MicroBatches)
	for j := range subs {
		sub, err := NewPartitioner(cfg)
		if err != nil {
			return nil
		}
		sub.sequential, sub.dpLimit = p.sequential, subDPLimit
		subs[j] = sub
	}
	p.subs[i] = subs
	return subs
}
