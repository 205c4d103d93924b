package natsenv

import (
	"context"
	"time"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go/jetstream"
)

// Assets are the JetStream assets of one job as the service declares them:
// the state bucket (proto.BucketName), the quarantine bucket
// (QuarantineBucket), the lease bucket (LeaseBucket) and, on the JetStream
// data plane, the batch stream (proto.StreamName) with one durable consumer
// per rank (proto.ConsumerName). Each Ensure verb creates its asset, or
// updates it to this declaration, and returns it; the service calls them at
// setup and again to recreate an asset that was lost. A value holds no
// state: the settings only.
type Assets struct {
	Job string
	// Memory keeps the state bucket and the stream in memory instead of
	// the file store.
	Memory bool
	// Replicas is the replication factor of every asset in a cluster.
	Replicas int
	// LeaseTTL is the age limit of the lease bucket's entries.
	LeaseTTL time.Duration
	// StreamMaxBytes and Duplicates bound the stream (proto.StreamConfig).
	StreamMaxBytes int64
	Duplicates     time.Duration
	// MaxAckPending and AckWait are each rank consumer's prefetch and
	// redelivery timeout (proto.ConsumerConfig).
	MaxAckPending int
	AckWait       time.Duration
}

// EnsureState creates or updates the job's state bucket (proto.EnsureKV).
func (a Assets) EnsureState(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	return proto.EnsureKV(ctx, js, a.Job, a.Memory, a.Replicas)
}

// EnsureQuarantine creates or updates the job's quarantine bucket: one
// record per quarantined sample id, on the file store.
func (a Assets) EnsureQuarantine(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	return js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: QuarantineBucket(a.Job),
		Description: "mmfeed quarantine records of job " + a.Job + ", one per sample",
		History:     1, Storage: jetstream.FileStorage, Replicas: max(a.Replicas, 1)})
}

// EnsureLease creates or updates the job's lease bucket, as OpenLease
// does: the service recreates it empty when it was lost, and the lease's
// next renewal creates its key again.
func (a Assets) EnsureLease(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	return js.CreateOrUpdateKeyValue(ctx, leaseBucketConfig(a.Job, a.LeaseTTL, a.Replicas))
}

// leaseBucketConfig is the lease bucket's configuration (OpenLease and
// EnsureLease): one entry, which expires after the TTL.
func leaseBucketConfig(job string, ttl time.Duration, replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: LeaseBucket(job), Description: "mmfeed leadership of job " + job,
		History: 1, TTL: ttl, Storage: jetstream.FileStorage, Replicas: max(replicas, 1)}
}

// EnsureStream creates or updates the job's batch stream
// (proto.EnsureStream).
func (a Assets) EnsureStream(ctx context.Context, js jetstream.JetStream) (jetstream.Stream, error) {
	return proto.EnsureStream(ctx, js, proto.StreamConfig{Job: a.Job, MaxBytes: a.StreamMaxBytes,
		Duplicates: a.Duplicates, Memory: a.Memory, Replicas: a.Replicas})
}

// EnsureConsumer creates or updates rank (dp, mp)'s durable consumer of
// the stream (proto.EnsureConsumer with the default consumer settings but
// MaxAckPending and AckWait).
func (a Assets) EnsureConsumer(ctx context.Context, js jetstream.JetStream, dp, mp int) (jetstream.Consumer, error) {
	cc := proto.DefaultConsumerConfig(a.Job, dp, mp)
	cc.MaxAckPending, cc.AckWait = a.MaxAckPending, a.AckWait
	return proto.EnsureConsumer(ctx, js, cc)
}
