// Package balancer turns per-sample cost features into a cost-balanced training
// plan: which sample goes to which step, data-parallel rank and micro-batch.
//
// # Inputs
//
// A slice of [Item] in the epoch's (already shuffled) order: a stable id, the
// text length L in tokens (special tokens included, after truncation), the
// number of image tokens P and an image complexity estimate. The package never
// sees pixels or text; it imports no NATS, imaging or tokenizer package.
//
// # Cost model
//
// [CostModel] maps one sample to a [Cost] vector (vision, text, fusion) that is
// linear in the features [L, L², P, P², L·P, complexity, 1] ([Features]). The
// default coefficients come from transformer FLOPs of a [ModelShape] (presets
// "tiny" and "base"); [Calibrate] refits them from measured step times by
// non-negative least squares. A rank's step cost depends on the [Placement]:
// colocated = vision + text + fusion, modality = max(vision, text) + fusion,
// each summed over the rank's samples. The trainer pads every micro-batch to
// its longest L and largest P, so a micro-batch costs its entries × the cost
// at (L_max, P_max) ([PaddedFeatures]); step statistics, the report and the
// partitioner's objective all use this padded cost. With [Config.Pack] the
// trainer packs each micro-batch instead (captions and patches concatenated,
// attention within each sample): a micro-batch costs the sum of its samples'
// own costs plus [CostModel.MicroBatchOverhead] ([PackedFeatures]), budgets
// count text + image tokens ([Budget.MaxTokens], GlobalTokens), and the
// packed partitioner balances equal sums almost exactly. docs/cost-model.md derives the formulas. [Sync] says where the trainer's ranks wait for each
// other: at every micro-batch ([SyncMicroBatch], the default: a step costs Σ
// over micro-batch positions of the slowest rank's micro-batch there, every
// rank running its micro-batches costliest first) or only at the gradient
// all-reduce ([SyncStep]: the slowest rank's total).
//
// The CPU cost model of preprocessing is here too: [WorkCostModel] predicts
// a work item's seconds on one worker core from its [WorkCost] (megapixels
// by format, megabytes, samples), by ridge regression towards a prior shape
// with forgetting, fitted to the workers' measured times (the planner role
// of pipeline/serve builds the WorkCost from the features and holds the
// model under its lock). It and [Calibrate] share one least-squares solve
// (nnls.go, solveSubset: Cholesky over the active columns with a diagonal
// ridge).
//
// # Outputs
//
// [Build] produces a [Plan]: steps × dp ranks × micro-batches × entries, where an
// entry is an item index and a weight (1 real, 0 padding). Every rank gets the
// same number of steps and of micro-batches per step, always; the tail of the
// epoch is dropped or padded with zero-weight copies ([Tail]). The plan is a
// pure function of (items, [Config]): [Plan.WriteJSONL] is byte-identical for
// the same inputs and [Plan.From] resumes at any step. [Start] returns a
// [Planner] that plans the same steps one lookahead window at a time
// ([Planner.PlanNext]; the step count is known before the first), for a
// service that publishes the first steps while the rest are planned;
// [Planner.Hash] names the plan from its first window on. Three strategies share
// the Plan type: [StrategyMmfeed] (cost-balanced: lookahead windows dealt
// over steps × ranks so that every step can be split evenly, then a
// partitioner per step that minimises the padded step cost under Sync over
// several candidates, the random split among them; see "Partitioning" below
// and docs/cost-model.md, "Balancing"), [StrategyRandom]
// (DistributedSampler) and [StrategyLengthGrouped] (HuggingFace
// LengthGroupedSampler). [Compare] runs all three on the same items and returns
// a [Report] (JSON, [Report.WriteTable], [WriteHTML]). Step statistics carry
// a lower bound on any split's step cost ([StepCostLowerBound], valid padded
// and packed) and the epoch efficiency (Σ ideal step cost / Σ step cost), so
// a report tells a step the partitioner could not balance from one no
// partition could.
//
// # Partitioning
//
// [Partitioner.Partition] splits one step's samples into DP × MicroBatches
// micro-batches. It is a pipeline, padded (partition.go, partitionPadded) and
// packed (packed.go, partitionPacked) alike:
//
//  1. candidate generators return assignments (slot r·M+m: rank r's
//     micro-batch m): sorted orders cut into groups and dealt to the ranks
//     (groupchoice.go, grouping.go), positions-first under SyncMicroBatch
//     (positions.go, split by sub-partitioners), balance-first on small
//     batches and the random baseline's split (candidates.go); packed, the
//     level and LPT deals;
//  2. one scoring function (score; packed, packScore) gives the step cost
//     under Sync and picks the best;
//  3. refinement passes (padSearch, levelPositions, levelPipeline; packed,
//     refinePositions and refineAcross) improve an assignment held in an
//     explicit scratch value (padScratch, packScratch, pipeLevel).
//
// A call's inputs live in a job (items, costs, their orders), read-only once
// built; the Partitioner itself holds only its configuration. Every tuning
// constant is in tuning.go with the reason for its value. Searches are
// bounded by counts, never clocks, so a plan does not depend on the machine
// or on how many candidates ran concurrently.
//
// # The report page
//
// [WritePage] renders a Report (and, under serve, a [LiveView]) as one
// self-contained HTML page of inline SVG drawn here: every step's per-rank cost
// as a heatmap, imbalance and efficiency over steps, sample histograms,
// quarantine reasons and thumbnails. The caller supplies the thumbnails as
// encoded bytes ([Thumbnail]); this package never decodes an image.
// [LiveHandler] serves the page, its live fragment (?part=live, which the page
// polls) and the JSON. Numbers carry data-key attributes naming their JSON path
// (docs/report.md).
//
// # Ownership and concurrency
//
// Functions never modify the caller's items; a Plan keeps a reference to the
// items slice it was built from, so the caller must not modify it afterwards.
// Plans, Reports and CostModels are immutable after construction and safe for
// concurrent readers. A [Partitioner] keeps no state between calls (each
// Partition call has its own scratch), so one may serve several goroutines.
package balancer
