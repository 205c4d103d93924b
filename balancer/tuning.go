package balancer

// Every tuning constant of the partitioner (Partition, padded and packed) and
// of the lookahead redeal lives here, grouped by the pipeline stage that uses
// it. None of them changes what a plan must satisfy (budgets, cover, every
// rank's micro-batch count); they trade plan quality against time. Counts,
// not clocks, bound every search, so a plan is a function of its input
// alone, on any machine and any number of cores. docs/cost-model.md,
// "Partitioner", describes the stages.

// ---- The padded pipeline: which candidates are built and refined.

// retryImbalance is the max / mean − 1 (before refinement) above which the
// length-sorted grouping candidate is retried with cuts that trade padding
// for equal group costs (balancedCuts).
const retryImbalance = 2e-3

// refineCandidatesLimit is the batch size up to which the alternative
// candidates are refined by padSearch too; above it they are only evaluated
// (large batches are dense enough that the length-sorted grouping wins).
const refineCandidatesLimit = 256

// refineAltImbalance is the max / mean − 1 of the refined first candidate
// above which the alternatives are refined too.
const refineAltImbalance = 1e-2

// refineMargin: an alternative candidate is refined only when, unrefined,
// its maximum padded rank cost is within this share of the best so far; a
// local search rarely closes a wider gap.
const refineMargin = 0.25

// rankCutLimit bounds a rank's sample count for the exact cut program
// (O(M·n²)); above it a rank is cut into equal counts.
const rankCutLimit = 48

// balanceFirstLimit is the batch size from which the balanceFirst candidate
// is not built. It deals samples by unpadded cost, so its micro-batches mix
// lengths and pad heavily; on 216 layouts of 1,024 and 4,096 samples (fixed,
// dynamic and lumpy images; dp 8, 32, 64; 1, 2, 4 micro-batches; both syncs
// and placements) and on their positionsFirst sub-batches it never won,
// while it cost about 1 ms per call at 4,096 samples.
const balanceFirstLimit = 1024

// parallelMinItems is the batch size from which Partition builds its
// alternative candidates (balanceFirst, positionsFirst) on other goroutines
// while it refines the length-sorted grouping, and positionsFirst splits its
// chunks concurrently. Below it the goroutines cost more than they save. The
// candidates and the choice among them are the same either way, so the plan
// does not depend on the number of cores.
const parallelMinItems = 1024

// subDPLimit is dpGroupingLimit for positionsFirst's sub-partitioners.
const subDPLimit = dpGroupingLimit / 8

// ---- Grouping generators: sorted orders cut into DP × M groups.

// dpGroupingLimit bounds K·n for the exact grouping by dynamic programming;
// larger batches are dense enough in length that equal-cost cuts already pad
// little and balance well.
const dpGroupingLimit = 1 << 17

// lambdaSteps is the number of bisection steps of the balance weight λ.
const lambdaSteps = 10

// closeEnough ends the bisection once the grouping leaves at most this share
// of its allowed padding slack unspent.
const closeEnough = 0.25

// initialSlack is the share of the padding slack (between the padding-optimal
// grouping and the padding target) the initial grouping may spend on equal
// group costs; the rest is left to the refinement.
const initialSlack = 0.5

// lambdaLog2Min and lambdaLog2Max bound the bisection of log2 λ in
// balancedCuts (λ in units of one average group's padded tokens).
const (
	lambdaLog2Min = -8.0
	lambdaLog2Max = 12.0
)

// minMaxTolerance ends minMaxCuts' bisection once the threshold's bracket is
// within this share of its upper end (0.2%).
const minMaxTolerance = 2e-3

// minMaxSteps bounds the bisection of minMaxCuts' threshold.
const minMaxSteps = 24

// cutStride is the block of samples stridedCuts adds to a group at once
// (and summarises once per minMaxCuts). It changes no cut, only how many
// pricings find them (about g / cutStride + cutStride / 2 for a group of g
// samples); at 4,096 samples on 64 ranks 8 was fastest, 6 to 16 within 1.5%
// of it, 4 3% slower.
const cutStride = 8

// ---- padSearch, the local search on the padded rank costs.

// movesPerItem bounds padSearch's accepted moves per sample when
// PartitionConfig.MaxMoves is 0.
const movesPerItem = 8

// minGain is the relative improvement below which a move is not worth making.
const minGain = 1e-7

// maxPartners bounds how many of the lightest ranks the refinement tries per
// step before it stops: when the lightest ranks cannot take work from the
// heaviest, heavier ones rarely can.
const maxPartners = 16

// maxSwapPartners bounds the partners the refinement tries swaps with (a swap
// looks at every pair of samples of the two ranks).
const maxSwapPartners = 4

// padSearchEvals bounds the exchanges one padSearch evaluates (about 40 ns
// each), so that a partition takes milliseconds however large the batch; the
// count, not the clock, stops it, so the result stays deterministic. The
// bound is evalsPerItem per item, at most padSearchEvals.
const (
	padSearchEvals = 1 << 15
	evalsPerItem   = 128
)

// settledImbalance is the max / mean − 1 at which padSearch stops: closer
// to even is noise next to the cost model's error.
const settledImbalance = 5e-4

// ---- levelPositions: micro-batch positions levelled under SyncMicroBatch.

// levelBudget bounds levelPositions' exchange evaluations per sample (a
// count, so the result stays deterministic).
const levelBudget = 32

// ---- levelPipeline, the refinement under pipeline parallelism (PP > 1).

// pipeMovesPerSlot bounds levelPipeline's moves per micro-batch.
const pipeMovesPerSlot = 4

// levelTargets is how many of the step's cheapest micro-batches (besides
// the costliest one's own rank) a move may go to. All of them cost 4 ms per
// move at 64 ranks × 4 (4,096 samples) and gained less (1.7% against 2.1%:
// the search is greedy); 32 gained 0.6%, 8 0.4%.
const levelTargets = 64

// positionPartners is how many of a micro-batch position's cheapest bins
// the packed levelling (refinePositions) tries to level its costliest bin
// with per move. Unbounded, dp 1,024 × 16,384 samples planned at 144 ms per
// step against 52 ms with 64, for 0.0006 of epoch efficiency (0.9948 against
// 0.9942); fixed resolution at dp 512 lost 0.0005.
const positionPartners = 64

// ---- The lookahead redeal (redeal.go): a window's samples spread over its
// steps before each step is partitioned.

// repairTolerance is the virtual imbalance (max / mean − 1) of a window's
// worst step below which the redeal stops repairing.
const repairTolerance = 1e-3

// levelTolerance is the virtual imbalance (max / mean − 1) below which a
// step's levelling stops: the partitioner splits the step again, so evening
// the virtual ranks further only costs time (at dp 128 × 2,048 samples per
// step, without it the levelling made 45 exchanges per call, most of them
// below 1e-4).
const levelTolerance = 1e-4

// levelMoves bounds a full levelling of a step: at most levelMoves × DP
// exchanges (was 4 × DP², which at fixed resolution, where many samples cost
// almost the same, spent 1.7 s of a dp-512 epoch on exchanges of tiny gains).
const levelMoves = 8

// repairLevel bounds the exchanges of the levelling after each swap the
// repair tries or makes (it levels every step in full when it ends). At dp 128
// × 2,048 samples per step, 1 to 32 chose the same swaps as an unbounded
// levelling (which made about 45 exchanges per step) in a ninth of the time.
const repairLevel = 4

// repairCandidates is how many cross-step swaps, closest to the wanted
// transfer, the repair evaluates in full per round.
const repairCandidates = 16

// ---- The packed pipeline (packed.go).

// packMinGain is the relative score gain below which a packed refinement
// move is not worth taking (it guards against cycling on float noise).
const packMinGain = 1e-9

// packPasses bounds the packed refinement: moves per position per sample in
// refinePositions, and rounds per position in refineAcross.
const packPasses = 8

// packPairTolerance stops levelling a pair of packed bins once their costs
// differ by less than this fraction of the costlier; packLevels also lets a
// bin exceed its level by this fraction.
const packPairTolerance = 1e-4
