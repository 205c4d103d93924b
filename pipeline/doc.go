// Package pipeline composes the packages into the jobs the commands run: it reads a
// dataset index (loader), extracts each sample's cheap features (tokenize for text
// length, imgproc headers for image tokens and complexity), plans an epoch (balancer),
// preprocesses the planned samples on a worker pool (tokenize ids, imgproc tensors) and
// hands out per-(step, rank, micro-batch) rows in plan order (proto rows), which the
// shard writer puts in Arrow IPC files and the server publishes on NATS.
//
// It exists so that cmd/mmfeed stays flags → Config → Run and each package keeps one
// concept: loader knows no images, balancer knows no tokenizers, proto knows no plans.
//
// A job opens its dataset once (OpenDataset): the index, the tokenizer, the image
// processor, the index scan's rejects and, on the first Dataset.Epoch, every entry's
// features (one feature pass, or one read of the feature cache). Dataset.Epoch orders it
// for (seed, epoch) and gives the planner's Prepared (the epoch's features, its
// quarantine with the scan's and the feature pass's rejects written again for that
// epoch) without reading the index, the tokenizer or an image header again: serve plans
// every epoch that way, and its workers preprocess rows from the Dataset they opened
// (Dataset.Preprocessor); the report thumbnails its epochs make are kept for the next. A
// Dataset is safe for concurrent use; its owner closes it after the Prepared epochs it
// gave, which share its index and tokenizer. Prepare is OpenDataset and one Epoch, for
// jobs that order the dataset once (`report`; `shard`, whose later epochs are that
// dataset's Epoch too); its result closes the dataset.
//
// Memory (issue 21, docs/BENCHMARKS.md "Planner memory per sample"): the dataset keeps
// its features in columns of ~25 bytes an entry (ids are the index entries' own
// strings), and an epoch's Features refer to the index's entries by position
// (Features.Order) through the index's loader.EntryView rather than copying them, with
// formats in a one-byte column (Format). A manifest's or a local WebDataset shard's
// index is packed (loader: its captions are re-read by offset), so Features.Entry
// re-reads one record: the planner's per-sample paths read Features.ID and
// Features.ImageSize, which do not, and a feature pass reads entries a range at a time.
//
// RunShard is `mmfeed shard` (the command parses flags into a ShardJob and prints its
// ShardResult). Shard writes a dataset once for many epochs (docs/shard.md): per-rank Arrow
// IPC data files of the first epoch's plan (tensor or JPEG pixels, zstd/lz4 buffers), the
// draws only later epochs plan (Dataset.Epoch of each: a mixture's too), stored once, one
// plan index per epoch and a manifest written last, into a Store (a
// folder or an s3/gs/az/file URL through gocloud.dev/blob; objects appear only when complete).
// A rerun with the same fingerprint keeps every part whose files still hash as recorded.
// Data files hold one sample per record batch (ShardOptions.RecordRows), so a later epoch's
// gather decompresses only the rows it reads. OpenInput streams WebDataset shards from an
// input URL (a loader.Remote over the bucket: members as they arrive, images by ranged
// reads) and stages other inputs with StageInput, which copies an input URL to a local
// cache; LoadCostModel reads the cost-model files `serve` exports. OpenDataset does the
// same for an input URL itself (Config.InputCache), so every command and every serve worker
// reads s3://, gs://, az://, http(s):// and file:// inputs.
//
// Kept fields (Config.Loader.Keep, --keep): the index holds each sample's values; every
// BatchMeta of a job gets KeepColumns(index) and every row the entry's values
// (Preprocessor.Row), so shard files and served batches carry them as proto kept columns;
// KeptReport puts their types and missing counts into the report.
//
// Config.FeatureCache keeps the features of a whole index under the dataset's
// Fingerprint (tokenizer settings and file hash, image config, loader options, every
// entry's id, location, caption and image size, the local input files' size and mtime):
// a Dataset reads them from it instead of running the feature pass, or stores what it
// computed. DirFeatureCache is one in a folder (`shard`, `report`); serve's is in the
// JetStream object store.
//
// Augmentation (Config.Image.Augment, docs/augment.md): a sample's random resized crop and
// flip are drawn from AugmentRand(seed, epoch, id) and its header size alone, so
// Dataset.Epoch reprices its image tokens with the epoch's crop under dynamic resolution
// (fixed policies keep Size×Size), Preprocessor.EpochRow builds a row of a named epoch
// (a worker's batch item), and OutputSize is the shape a planner expects. Shard refuses
// several epochs under augmentation (ErrAugmentEpochs): its data files hold one epoch's
// crops.
//
// Config.Mixture, instead of Config.Input, makes the dataset a weighted mixture (mixture.go,
// docs/mixtures.md): one combined index, and an epoch of draws in which a repeated sample
// is a distinct item with its draw id; Prepared.MixtureReport gives each source's share,
// samples, tokens and cost per step of a plan.
//
// Every sample is accounted for: a sample whose features or preprocessing fail is written
// to the quarantine (loader.QuarantineWriter) with a reason code, and
// planned + quarantined + dropped-at-tail = samples seen (for a mixture: = draws, plus the
// index scan's rejects). An epoch whose every sample was quarantined fails (Dataset.Epoch,
// Prepare) with an AllQuarantinedError wrapping ErrAllQuarantined: the most frequent
// reason, its count, one example and the flag that fixes it (allquarantined.go), so
// `shard`, `report` and `serve` exit non-zero instead of writing nothing.
//
// One builder per fact (issue 24): a fact that several jobs share is built by one function.
// Prepared.BatchMeta is the batch metadata of a job (tokenizer, kept columns, packing,
// normalization, pixel encoding and shape, none under imgproc.PolicyDynamic) for shard files
// (which set the store's dtype), served batches (which set the step and the ranks) and shard
// work items alike; PlannedRow is a plan entry's row before preprocessing (id, token counts,
// step cost, weight), which Preprocessor.Run preprocesses here and a serve batch item
// carries to a worker; serve's encodeRows builds and encodes every micro-batch payload, the
// publisher's and the worker's. Waits shared with proto and serve (a pause that ends with
// its context, a non-blocking done test) are internal/ctxutil's Sleep and Closed.
package pipeline
