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
// Every sample is accounted for: a sample whose features or preprocessing fail is written
// to the quarantine (loader.QuarantineWriter) with a reason code, and
// planned + quarantined + dropped-at-tail = samples seen.
package pipeline
