package balancer

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Refinement selects what the partitioner does after its initial assignment.
type Refinement int

// Refinements.
const (
	// RefineLocalSearch moves and swaps single samples between the most loaded
	// rank's micro-batches and those of lighter ranks (or of the same rank)
	// while that lowers the maximum padded rank cost (default).
	RefineLocalSearch Refinement = iota
	// RefineNone keeps the initial assignment (LPT over length-sorted
	// micro-batches); for measurements.
	RefineNone
)

// PartitionConfig configures how one global batch is split.
type PartitionConfig struct {
	// DP is the number of data-parallel ranks (≥ 1).
	DP int `json:"dp"`
	// MicroBatches is the number of micro-batches per rank and step (≥ 1);
	// every rank gets exactly this many, each with at least one entry.
	MicroBatches int `json:"micro_batches"`
	// Budget bounds every micro-batch.
	Budget Budget `json:"budget"`
	// Placement selects the rank cost being minimised.
	Placement Placement `json:"placement"`
	// Sync selects the step cost minimised: with SyncMicroBatch, every rank's
	// micro-batches are ordered costliest first and the step costs Σ over
	// positions of the costliest micro-batch there; with SyncStep, the
	// largest rank cost.
	Sync Sync `json:"sync"`
	// Model prices a micro-batch padded to its longest L and largest P
	// (PaddedFeatures); the rank cost minimised is the sum of its
	// micro-batches' padded costs. The zero value means the tiny preset.
	Model CostModel `json:"model"`
	// PaddingTarget is a soft preference: the length-sorted candidate
	// grouping may spend padding (real / padded text tokens) down to it on
	// equal group costs. Padding itself is part of the objective (padded
	// rank cost), so no candidate is held to it. In (0, 1]; default 0.95.
	PaddingTarget float64 `json:"padding_target"`
	// Refinement selects the refinement after the initial assignment.
	Refinement Refinement `json:"refinement"`
	// MaxMoves bounds the refinement's accepted moves; 0 means 8 × items.
	MaxMoves int `json:"max_moves,omitempty"`
	// Pack selects the packed objective (packed.go): a micro-batch costs Σ
	// of its samples' costs plus the model's MicroBatchOverhead, with no
	// padding term, and the budget is checked with Budget.FitsPacked.
	Pack bool `json:"pack,omitempty"`
	// PP is the trainer's pipeline stages (0 or 1: none). Above 1 a rank's
	// step costs (Σ micro-batch + (PP − 1) × costliest micro-batch) / PP
	// (pipecost.go), and Partition also levels micro-batches within ranks.
	PP int `json:"pp,omitempty"`
}

// DefaultPartitionConfig returns dp 8, 2 micro-batches, colocated, padding
// target 0.95, local search, no budget.
func DefaultPartitionConfig() PartitionConfig {
	return PartitionConfig{DP: 8, MicroBatches: 2, PaddingTarget: 0.95}
}

// Validate checks the fields.
func (c PartitionConfig) Validate() error {
	switch {
	case c.DP < 1 || c.DP > 1<<16:
		return fmt.Errorf("balancer: dp %d outside [1, 65536]: %w", c.DP, ErrInvalidConfig)
	case c.MicroBatches < 1 || c.MicroBatches > 1<<12:
		return fmt.Errorf("balancer: micro-batches %d outside [1, 4096]: %w", c.MicroBatches, ErrInvalidConfig)
	case c.Placement != Colocated && c.Placement != Modality:
		return fmt.Errorf("balancer: placement %v: %w", c.Placement, ErrInvalidConfig)
	case c.Sync != SyncMicroBatch && c.Sync != SyncStep:
		return fmt.Errorf("balancer: sync %v: %w", c.Sync, ErrInvalidConfig)
	case !(c.PaddingTarget > 0 && c.PaddingTarget <= 1):
		return fmt.Errorf("balancer: padding target %v outside (0, 1]: %w", c.PaddingTarget, ErrInvalidConfig)
	case c.Refinement != RefineLocalSearch && c.Refinement != RefineNone:
		return fmt.Errorf("balancer: refinement %d: %w", c.Refinement, ErrInvalidConfig)
	case c.PP < 0 || c.PP > MaxPP:
		return fmt.Errorf("balancer: pp %d outside [0, %d]: %w", c.PP, MaxPP, ErrInvalidConfig)
	case c.MaxMoves < 0:
		return fmt.Errorf("balancer: max moves %d: %w", c.MaxMoves, ErrInvalidConfig)
	}
	if err := c.model().Validate(); err != nil {
		return err
	}
	return c.Budget.Validate()
}

// Assignment is one global batch split into DP × MicroBatches micro-batches.
type Assignment struct {
	DP, MicroBatches int
	// Members[r*MicroBatches+m] lists the positions (indices into the items
	// given to Partition) of rank r's micro-batch m, longest text first; a
	// rank's micro-batches come costliest first.
	Members [][]int32
}

// MicroBatch returns the positions of rank r's micro-batch m.
func (a Assignment) MicroBatch(r, m int) []int32 { return a.Members[r*a.MicroBatches+m] }

// Partitioner splits global batches. It holds only its configuration and
// what follows from it: every Partition call keeps its state in its own
// values (job, padScratch, packScratch), so a Partitioner may be shared by
// goroutines.
type Partitioner struct {
	cfg   PartitionConfig
	model CostModel
	total Features // Σ over components of model's coefficients
	// dpLimit is the K·n up to which the grouping is exact
	// (tuning.dpGroupingLimit; smaller for positionsFirst's sub-partitioners).
	dpLimit int
	// sequential builds every candidate on the calling goroutine (tests).
	sequential bool
	// fullPricing turns off the shortcuts that shapePriced and growingCost
	// allow, so that every exchange and cut is priced in full (tests).
	fullPricing bool
	// sub marks positionsFirst's sub-partitioners: their plans are only
	// candidates of the caller's, which weighs the random split itself, so
	// they skip it.
	sub bool
}

// job is one Partition call's input, read-only once built: the items, their
// cost vectors and step costs. Candidate generators read it (some of them
// concurrently); refinement passes change only the padScratch they are given.
type job struct {
	*Partitioner
	items    []Item
	costs    []Cost
	stepCost []float64 // stepCost[i]: Placement.StepCost(costs[i])
	ranked   rankKeys  // the items ranked by (Cost.Total, position); padded only
	// longFirst[pos] orders entries longest text first, ties by position
	// (assignment); padded only.
	longFirst []uint64
	// shapePriced: a padded micro-batch's cost is a function of its count,
	// longest L and largest P alone (the model has no complexity term, as
	// CostModel.Validate demands, and every complexity is finite), so
	// padSearch prices swaps of the same shapes once and levelPositions
	// skips complexity sums.
	shapePriced bool
	// growingCost: shapePriced and no token count is negative, so a group's
	// padded cost and budget fields cannot fall as it grows: padSearch
	// counts without pricing the swaps that cannot win, and greedyCuts
	// adds whole blocks (stridedCuts).
	growingCost bool
}

func (p *Partitioner) newJob(items []Item, costs []Cost) *job {
	jb := &job{Partitioner: p, items: items, costs: costs, stepCost: make([]float64, len(items))}
	for i, c := range costs {
		jb.stepCost[i] = p.cfg.Placement.StepCost(c)
	}
	if !p.cfg.Pack {
		totals := jb.stepCost
		if p.cfg.Placement != Colocated { // colocated, the step cost is the total
			totals = make([]float64, len(costs))
			for i, c := range costs {
				totals[i] = c.Total()
			}
		}
		jb.ranked = newRankKeys(totals)
		jb.longFirst = make([]uint64, len(items))
		jb.shapePriced = p.model.Coef[Vision][FeatComplexity] == 0 && p.model.Coef[Text][FeatComplexity] == 0 &&
			p.model.Coef[Fusion][FeatComplexity] == 0 && p.total[FeatComplexity] == 0
		nonNegative := true
		for i, it := range items {
			jb.longFirst[i] = uint64(math.MaxUint32-uint32(it.TextTokens))<<32 | uint64(i)
			if !(math.Abs(it.Complexity) <= MaxComplexity) {
				jb.shapePriced = false
			}
			nonNegative = nonNegative && it.TextTokens >= 0 && it.ImageTokens >= 0
		}
		jb.growingCost = jb.shapePriced && nonNegative
		if p.fullPricing {
			jb.shapePriced, jb.growingCost = false, false
		}
	}
	return jb
}

// padScratch is the state the padded refinement passes and the scoring
// function work on: one candidate loaded as groups (slot r*M+m belongs to
// rank r) with their padded costs and the ranks' sums. Every pass takes it
// explicitly and leaves in it the candidate it refined.
type padScratch struct {
	groups  []group
	rank    []Cost    // per-rank padded cost sums
	step    []float64 // per-rank step costs (Placement.StepCost of rank)
	slotMax []float64 // syncedCost's buffer
	posTop  []top3    // levelPositions' per-position summary (syncedTops)
}

// group is one micro-batch under construction.
type group struct {
	members      []int32
	maxL, atMax  int // longest L and how many members have it
	second       int // longest L below maxL (0 if none)
	maxP, atMaxP int // largest P and how many members have it
	secondP      int // largest P below maxP (0 if none)
	sumP         int
	cplx         float64 // Σ complexity
	cost         Cost    // padded cost (PaddedFeatures)
	firstPos     int32
	contiguousID int32
}

// NewPartitioner validates cfg and returns a Partitioner.
func NewPartitioner(cfg PartitionConfig) (*Partitioner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := cfg.model()
	return &Partitioner{cfg: cfg, model: m, total: m.Coef[Vision].Add(m.Coef[Text]).Add(m.Coef[Fusion]), dpLimit: dpGroupingLimit}, nil
}

// padCost returns the padded cost of a micro-batch shape as the partitioner
// keeps it: colocated step costs only need the total, kept in Vision (one dot
// product instead of three); modality needs the components.
func (p *Partitioner) padCost(s mbShape) Cost {
	if p.cfg.Placement == Colocated {
		return Cost{Vision: fastDot(&p.total, s)}
	}
	c := &p.model.Coef
	return Cost{fastDot(&c[Vision], s), fastDot(&c[Text], s), fastDot(&c[Fusion], s)}
}

// model returns the configured cost model, the tiny preset when zero.
func (c PartitionConfig) model() CostModel {
	if c.Model == (CostModel{}) {
		m, _ := NewCostModel(TinyShape())
		return m
	}
	return c.Model
}

// Config returns the partitioner's configuration.
func (p *Partitioner) Config() PartitionConfig { return p.cfg }

// Partition splits items (with their cost vectors, costs[i] for items[i]) into
// DP ranks × MicroBatches micro-batches, minimising the step cost under the
// budget: padded, the maximum padded rank cost (Σ over the rank's
// micro-batches of their PaddedFeatures' cost; with SyncMicroBatch at least
// Σ over positions of the costliest micro-batch there), packed (Config.Pack,
// packed.go) the same over packed costs. It is a pipeline (doc.go,
// "Partitioning"): candidate generators each return an assignment, one
// scoring function picks the best, and refinement passes improve it with an
// explicit scratch value. No candidate kept is worse than the random
// baseline's split of the same items. It fails with ErrTooFewItems when
// len(items) < DP × MicroBatches and with ErrBudgetExceeded when the budget
// cannot hold the items.
func (p *Partitioner) Partition(items []Item, costs []Cost) (Assignment, error) {
	k := p.cfg.DP * p.cfg.MicroBatches
	if len(costs) != len(items) {
		return Assignment{}, fmt.Errorf("balancer: %d items but %d costs: %w", len(items), len(costs), ErrInvalidConfig)
	}
	if len(items) < k {
		return Assignment{}, fmt.Errorf("balancer: %d items for %d ranks × %d micro-batches: %w", len(items), p.cfg.DP, p.cfg.MicroBatches, ErrTooFewItems)
	}
	if len(items) > 1<<30 {
		return Assignment{}, fmt.Errorf("balancer: %d items in one global batch: %w", len(items), ErrInvalidConfig)
	}
	if !p.cfg.Budget.Unlimited() { // else every item fits
		for i := range items {
			if err := p.cfg.Budget.ItemFits(items[i]); err != nil {
				return Assignment{}, err
			}
		}
	}
	jb := p.newJob(items, costs)
	var a Assignment
	var err error
	if p.cfg.Pack {
		a, err = jb.partitionPacked()
	} else {
		a, err = jb.partitionPadded()
	}
	if err != nil {
		return Assignment{}, err
	}
	return jb.levelPipeline(a), nil
}

// partitionPadded is Partition's padded pipeline:
//
//  1. generators: the grouping candidate (the length- or image-sorted order
//     cut into DP × M groups dealt to the ranks, groupedCandidate, refined
//     at once by padSearch because it usually wins), and the alternatives
//     balanceFirst, randomSplit and, under SyncMicroBatch, positionsFirst
//     over the grouping's order and over the cost order (built concurrently
//     on large batches, alternatives.go);
//  2. pick: score ranks them all (bestCandidate), refining the most
//     promising alternative too on small batches;
//  3. refinement: levelPositions under SyncMicroBatch (leveled), then
//     levelPipeline under PP > 1 (Partition).
func (jb *job) partitionPadded() (Assignment, error) {
	var alts pending
	defer alts.wait()
	jb.startIndependent(&alts)
	byLength := jb.sortByLength()
	need := jb.computeNeed(byLength)
	cuts, err := jb.initialCuts(byLength, need)
	if err != nil {
		return Assignment{}, err
	}
	sc := &padScratch{}
	g := jb.chooseGrouping(sc, byLength, cuts)
	jb.startGrouped(&alts, g.order)
	best := jb.groupedCandidate(sc, g)
	return jb.leveled(sc, jb.bestCandidate(sc, best, alts.wait())), nil
}

// groupedCandidate builds grouping g's candidate and refines it (refined);
// when the grouping is the length-sorted one, the batch small and the
// result more than retryImbalance from even, it also tries the length
// order cut into groups of more equal cost (balancedCuts), keeping the
// better.
func (jb *job) groupedCandidate(sc *padScratch, g grouping) Assignment {
	k := jb.cfg.DP * jb.cfg.MicroBatches
	if !g.loaded {
		jb.buildGroups(sc, g.order, g.cuts)
		jb.assignGroups(sc)
	}
	best, imb, hi := jb.refined(sc)
	if g.byLength && imb > 1+retryImbalance && k*len(jb.items) <= jb.dpLimit {
		if c := jb.balancedCuts(g.order, k, g.cuts); c != nil && !slices.Equal(c, g.cuts) {
			jb.buildGroups(sc, g.order, c)
			jb.assignGroups(sc)
			if a, _, h := jb.refined(sc); h < hi {
				best = a
			}
		}
	}
	return best
}

// leveled returns a with its positions levelled (levelPositions) when the
// ranks meet at every micro-batch and that lowers the step cost.
func (jb *job) leveled(sc *padScratch, a Assignment) Assignment {
	if jb.cfg.Sync != SyncMicroBatch || jb.cfg.MicroBatches == 1 || jb.cfg.DP == 1 || jb.cfg.Refinement != RefineLocalSearch {
		return a
	}
	before, _ := jb.score(sc, a.Members)
	jb.levelPositions(sc)
	if after, _ := jb.stepScore(sc); after < before*(1-minGain) {
		return jb.assignment(sc)
	}
	return a
}

// refined refines the groups loaded in sc (built and dealt to the ranks)
// with padSearch unless the ranks meet at every micro-batch (padSearch
// lowers the largest rank total, which is not that step cost: levelPositions
// refines the winner instead), and returns the assignment, its max / mean
// padded rank cost before the refinement (so that whether Partition retries
// does not depend on the refinement) and its max padded rank cost after it.
func (jb *job) refined(sc *padScratch) (Assignment, float64, float64) {
	hi, sum := jb.stepScore(sc)
	imb := 1.0
	if sum > 0 {
		imb = hi / (sum / float64(len(sc.step)))
	}
	if jb.cfg.Refinement == RefineLocalSearch && !jb.positionsApply() {
		jb.padSearch(sc)
		hi, _ = jb.stepScore(sc)
	}
	return jb.assignment(sc), imb, hi
}

// assignGroups gives every rank MicroBatches groups, largest group first to the
// rank where it raises the step cost least (LPT with a cardinality limit), and
// reorders sc.groups so that rank r owns slots r*M … r*M+M-1.
func (jb *job) assignGroups(sc *padScratch) {
	dp, m := jb.cfg.DP, jb.cfg.MicroBatches
	k := dp * m
	for g := range sc.groups {
		jb.refresh(sc, g)
	}
	pl := jb.cfg.Placement
	byCost := make([]int32, k)
	for i := range byCost {
		byCost[i] = int32(i)
	}
	slices.SortFunc(byCost, func(a, b int32) int {
		if c := cmp.Compare(pl.StepCost(sc.groups[b].cost), pl.StepCost(sc.groups[a].cost)); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	sc.rank = slices.Grow(sc.rank[:0], dp)[:dp]
	sc.step = slices.Grow(sc.step[:0], dp)[:dp]
	clear(sc.rank)
	clear(sc.step)
	filled := make([]int, dp)
	target := make([]int32, k) // original group → new slot
	for _, g := range byCost {
		best, bestCost := -1, 0.0
		for r := range dp {
			if filled[r] == m {
				continue
			}
			c := pl.StepCost(sc.rank[r].Add(sc.groups[g].cost))
			if best < 0 || c < bestCost {
				best, bestCost = r, c
			}
		}
		target[g] = int32(best*m + filled[best])
		filled[best]++
		sc.rank[best] = sc.rank[best].Add(sc.groups[g].cost)
	}
	reordered := make([]group, k)
	for g, s := range target {
		reordered[s] = sc.groups[g]
	}
	copy(sc.groups, reordered)
	for r := range dp {
		sc.step[r] = pl.StepCost(sc.rank[r])
	}
}

// refresh recomputes group g's statistics from its members.
func (jb *job) refresh(sc *padScratch, g int) {
	gr := &sc.groups[g]
	gr.maxL, gr.atMax, gr.second, gr.sumP = 0, 0, 0, 0
	gr.maxP, gr.atMaxP, gr.secondP, gr.cplx = 0, 0, 0, 0
	gr.firstPos = -1
	for _, pos := range gr.members {
		it := &jb.items[pos]
		gr.maxL, gr.atMax, gr.second = top2(gr.maxL, gr.atMax, gr.second, it.TextTokens)
		gr.maxP, gr.atMaxP, gr.secondP = top2(gr.maxP, gr.atMaxP, gr.secondP, it.ImageTokens)
		gr.sumP += it.ImageTokens
		gr.cplx += it.Complexity
		if gr.firstPos < 0 || pos < gr.firstPos {
			gr.firstPos = pos
		}
	}
	gr.cost = jb.padCost(gr.shape())
}

// top2 adds v to a running (largest, count at largest, second largest).
func top2(hi, at, second, v int) (int, int, int) {
	switch {
	case v > hi:
		return v, 1, hi
	case v == hi:
		return hi, at + 1, second
	case v > second:
		return hi, at, v
	}
	return hi, at, second
}

// maxWithout returns the group's longest L after removing one member of length l.
func (g *group) maxWithout(l int) int {
	if l == g.maxL && g.atMax == 1 {
		return g.second
	}
	return g.maxL
}

// maxPWithout returns the group's largest P after removing one member with P = ip.
func (g *group) maxPWithout(ip int) int {
	if ip == g.maxP && g.atMaxP == 1 {
		return g.secondP
	}
	return g.maxP
}

// sortLongFirst sorts members longest text first, ties by position (by
// their longFirst keys, compared as integers), using keys as scratch; it
// returns keys for reuse.
func (jb *job) sortLongFirst(members []int32, keys []uint64) []uint64 {
	keys = keys[:0]
	for _, pos := range members {
		keys = append(keys, jb.longFirst[pos])
	}
	slices.Sort(keys)
	for i, k := range keys {
		members[i] = int32(uint32(k))
	}
	return keys
}

// assignment copies the groups out, micro-batches of a rank ordered
// costliest first (so that position j is alike on every rank, see
// syncedCost), entries longest first (ties by position).
func (jb *job) assignment(sc *padScratch) Assignment {
	dp, m := jb.cfg.DP, jb.cfg.MicroBatches
	a := Assignment{DP: dp, MicroBatches: m, Members: make([][]int32, dp*m)}
	backing := make([]int32, 0, len(jb.items))
	byLen := func(x, y int32) int { return cmp.Compare(jb.longFirst[x], jb.longFirst[y]) }
	var keys []uint64
	for r := range dp {
		gs := sc.groups[r*m : (r+1)*m]
		for i := range gs {
			keys = jb.sortLongFirst(gs[i].members, keys)
		}
		pl := jb.cfg.Placement
		slices.SortFunc(gs, func(x, y group) int {
			if c := cmp.Compare(pl.StepCost(y.cost), pl.StepCost(x.cost)); c != 0 {
				return c
			}
			if c := cmp.Compare(y.maxL, x.maxL); c != 0 {
				return c
			}
			return byLen(x.members[0], y.members[0])
		})
		for i := range gs {
			start := len(backing)
			backing = append(backing, gs[i].members...)
			a.Members[r*m+i] = backing[start:len(backing):len(backing)]
		}
	}
	return a
}
