package balancer

import (
	"fmt"
	"math/rand/v2"
)

// SimulateConfig sets up a scale simulation: what balancing buys at dp sizes larger than
// the machine at hand, from the cost model and the corpus's distribution of samples.
type SimulateConfig struct {
	// Ranks are the dp sizes to simulate, e.g. 64, 256, 1024.
	Ranks []int
	// PerRank is the samples per rank and step (the global batch grows with the ranks).
	PerRank int
	// Steps is the number of steps simulated per dp size. Default 16.
	Steps int
	// Seed draws the bootstrap samples.
	Seed uint64
}

// SimResult is the outcome at one dp size.
type SimResult struct {
	Ranks int `json:"ranks"`
	// StepTimeRandomOverMmfeed is random's Σ max-rank cost over mmfeed's: the predicted
	// speedup of a synchronous step from balancing.
	StepTimeRandomOverMmfeed float64 `json:"step_time_random_over_mmfeed"`
	RandomImbalanceP50       float64 `json:"random_imbalance_p50"`
	RandomImbalanceP99       float64 `json:"random_imbalance_p99"`
	MmfeedImbalanceP50       float64 `json:"mmfeed_imbalance_p50"`
	MmfeedImbalanceP99       float64 `json:"mmfeed_imbalance_p99"`
}

// Simulate estimates, for each dp size, the step-time ratio random / mmfeed. Each
// simulated step draws Ranks × PerRank samples with replacement from items (a bootstrap
// of the corpus), and both strategies plan the same draws with cfg's model, placement,
// micro-batches and budget.
//
// Assumptions (docs/cost-model.md, "Simulating scale"): a step takes as long as its
// slowest rank (synchronous data parallelism, communication overlapped or equal across
// ranks); the cost model is exact; samples are independent draws from the corpus; the
// lookahead window is off, so the result is what one global batch allows.
func Simulate(items []Item, cfg Config, sim SimulateConfig) ([]SimResult, error) {
	if len(items) == 0 {
		return nil, fmt.Errorf("balancer: simulate: no items: %w", ErrInvalidConfig)
	}
	if sim.PerRank < cfg.MicroBatches || sim.PerRank < 1 {
		return nil, fmt.Errorf("balancer: simulate: %d samples per rank < %d micro-batches: %w", sim.PerRank, cfg.MicroBatches, ErrInvalidConfig)
	}
	steps := sim.Steps
	if steps <= 0 {
		steps = 16
	}
	var out []SimResult
	for _, ranks := range sim.Ranks {
		if ranks < 1 {
			return nil, fmt.Errorf("balancer: simulate: %d ranks: %w", ranks, ErrInvalidConfig)
		}
		rng := rand.New(rand.NewPCG(sim.Seed, uint64(ranks)))
		draw := make([]Item, ranks*sim.PerRank*steps)
		for i := range draw {
			draw[i] = items[rng.IntN(len(items))]
			draw[i].ID = fmt.Sprint(i) // ids must be unique within an epoch
		}
		c := cfg
		c.DP, c.GlobalBatch, c.GlobalTokens, c.Lookahead, c.Tail = ranks, ranks*sim.PerRank, 0, 1, TailDrop
		res := SimResult{Ranks: ranks}
		var mm, rnd Summary
		for _, s := range []Strategy{StrategyMmfeed, StrategyRandom} {
			c.Strategy = s
			p, err := Build(draw, c)
			if err != nil {
				return nil, fmt.Errorf("balancer: simulate %d ranks: %w", ranks, err)
			}
			if s == StrategyMmfeed {
				mm = Summarize(p.Stats())
			} else {
				rnd = Summarize(p.Stats())
			}
		}
		res.StepTimeRandomOverMmfeed = rnd.StepCostSum / mm.StepCostSum
		res.RandomImbalanceP50, res.RandomImbalanceP99 = rnd.ImbalanceP50, rnd.ImbalanceP99
		res.MmfeedImbalanceP50, res.MmfeedImbalanceP99 = mm.ImbalanceP50, mm.ImbalanceP99
		out = append(out, res)
	}
	return out, nil
}
