package natsenv

import "github.com/mmfeed/mmfeed/proto"

// The work queue: one JetStream work-queue stream for every job's items,
// one durable pull consumer that every worker shares.
const (
	// WorkStream is the work-queue stream of every job's work items.
	WorkStream = "MMFEED_WORK"
	// WorkConsumer is the workers' shared durable consumer of WorkStream.
	WorkConsumer = "workers"
	// WorkPrefix starts every work-queue subject (mmfeedwork.<job>.items,
	// .result, .features).
	WorkPrefix = "mmfeedwork"
)

// WorkerInboxPrefix is the reply inbox prefix of a worker's own connection
// (`--role worker`): the worker credential may subscribe there only, never
// to a trainer's inbox (proto.InboxPrefix) or a batch subject.
const WorkerInboxPrefix = "_INBOX.mmfeedworker"

// WorkItemsSubject is where a job's work items are published.
func WorkItemsSubject(job string) string { return WorkPrefix + "." + job + ".items" }

// WorkResultSubject is where workers send a job's results (core NATS).
func WorkResultSubject(job string) string { return WorkPrefix + "." + job + ".result" }

// WorkFeaturesSubject is where workers send a job's feature results.
func WorkFeaturesSubject(job string) string { return WorkPrefix + "." + job + ".features" }

// WorkBucket is the object store of a job's preprocessing configs and
// tokenizer files, which batch items name by hash.
func WorkBucket(job string) string { return proto.BucketName(job) + "_work" }

// QuarantineBucket returns the KV bucket of a job's quarantine records:
// one key per quarantined sample id.
func QuarantineBucket(job string) string { return proto.BucketName(job) + "_quarantine" }

// LeaseBucket returns the KV bucket of a job's leadership lease:
// mmfeed_<job>_lease, whose age limit is the lease TTL.
func LeaseBucket(job string) string { return proto.BucketName(job) + "_lease" }

// LeaseKey is the leader's key in the lease bucket; its value is the
// holder's id.
const LeaseKey = "leader"
