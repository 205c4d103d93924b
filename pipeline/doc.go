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
// Shard writes a dataset once for many epochs (docs/shard.md): per-rank Arrow IPC data
// files of the first epoch's plan (tensor or JPEG pixels, zstd/lz4 buffers), the samples only
// later epochs use, one plan index per epoch and a manifest written last, into a Store (a
// folder or an s3/gs/az/file URL through gocloud.dev/blob; objects appear only when complete).
// A rerun with the same fingerprint keeps every part whose files still hash as recorded.
// Data files hold one sample per record batch (ShardOptions.RecordRows), so a later epoch's
// gather decompresses only the rows it reads. OpenInput streams WebDataset shards from an
// input URL (a loader.Remote over the bucket: members as they arrive, images by ranged
// reads) and stages other inputs with StageInput, which copies an input URL to a local
// cache; LoadCostModel reads the cost-model files `serve` exports.
//
// Config.FeatureCache keeps the features of a whole index under the dataset's
// Fingerprint (tokenizer settings and file hash, image config, loader options, every
// entry's id, location, caption and image size, the local input files' size and mtime):
// Prepare reads them from it instead of running the feature pass, or stores what it
// computed. DirFeatureCache is one in a folder (`shard`, `report`); serve's is in the
// JetStream object store.
//
// Every sample is accounted for: a sample whose features or preprocessing fail is written
// to the quarantine (loader.QuarantineWriter) with a reason code, and
// planned + quarantined + dropped-at-tail = samples seen.
package pipeline
