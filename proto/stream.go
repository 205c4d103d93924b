package proto

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamConfig configures a job's JetStream stream.
type StreamConfig struct {
	// Job names the stream (StreamName) and its subjects (BatchWildcard).
	Job string
	// MaxBytes bounds the stream. With DiscardNew a full stream rejects
	// publishes, and Publisher waits and retries: that is the backpressure
	// that bounds memory between preprocessing and trainers.
	MaxBytes int64
	// Duplicates is the Nats-Msg-Id dedupe window.
	Duplicates time.Duration
	// Memory selects memory storage instead of file storage.
	Memory bool
	// Replicas is the stream replication factor in a NATS cluster (1..5).
	Replicas int
}

// DefaultStreamConfig returns 1 GiB, a 2-minute dedupe window, file storage,
// one replica.
func DefaultStreamConfig(job string) StreamConfig {
	return StreamConfig{Job: job, MaxBytes: 1 << 30, Duplicates: 2 * time.Minute, Replicas: 1}
}

// Validate checks the fields.
func (c StreamConfig) Validate() error {
	if err := ValidateJob(c.Job); err != nil {
		return err
	}
	if c.MaxBytes <= 0 || c.Duplicates <= 0 || c.Replicas < 1 || c.Replicas > 5 {
		return fmt.Errorf("proto: stream config max_bytes=%d duplicates=%v replicas=%d: %w", c.MaxBytes, c.Duplicates, c.Replicas, ErrInvalidConfig)
	}
	return nil
}

func storage(memory bool) jetstream.StorageType {
	if memory {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
}

// EnsureStream creates or updates the job's stream: subjects
// mmfeed.<job>.batch.>, work-queue retention (a chunk is deleted once its
// rank's consumer acknowledges it), DiscardNew at MaxBytes, the dedupe
// window.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	subj, _ := BatchWildcard(cfg.Job)
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        StreamName(cfg.Job),
		Description: "mmfeed batches of job " + cfg.Job,
		Subjects:    []string{subj},
		Retention:   jetstream.WorkQueuePolicy,
		Discard:     jetstream.DiscardNew,
		MaxBytes:    cfg.MaxBytes,
		MaxMsgs:     -1,
		MaxAge:      0,
		Storage:     storage(cfg.Memory),
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.Duplicates,
	})
	if err != nil {
		return nil, fmt.Errorf("proto: ensure stream %s: %w", StreamName(cfg.Job), err)
	}
	return s, nil
}

// ConsumerConfig configures one rank's durable pull consumer and the Go
// Consumer that reads it.
type ConsumerConfig struct {
	Job            string
	DPRank, MPRank int
	// MaxAckPending bounds the chunks delivered and not yet acknowledged:
	// the prefetch. It must exceed the chunks of the batches a trainer holds
	// plus one batch being reassembled.
	MaxAckPending int
	// AckWait is how long the server waits for an ack before redelivering;
	// the trainer must Ack (or InProgress) a batch within it.
	AckWait time.Duration
	// PullMaxMessages is the Go client's pull buffer, in messages; used only
	// when PullMaxBytes is 0.
	PullMaxMessages int
	// PullMaxBytes is the Go client's pull buffer, in bytes (at least two
	// messages of the server's max_payload). Keep it under the server's
	// max_pending (64 MiB by default): the server disconnects a client with
	// more bytes pending as a slow consumer, and the chunks it had in flight
	// come back only after AckWait.
	PullMaxBytes int
	// MaxBatchBytes bounds one reassembled payload.
	MaxBatchBytes int64
	// ChunkTimeout fails a batch whose chunks have not all arrived this long
	// after its first, with ErrChunkMissing.
	ChunkTimeout time.Duration
}

// DefaultConsumerConfig returns 1024 chunks of prefetch, a 5-minute ack
// wait, a 32 MiB pull buffer, 1 GiB batches and a 2-minute chunk timeout.
func DefaultConsumerConfig(job string, dp, mp int) ConsumerConfig {
	return ConsumerConfig{Job: job, DPRank: dp, MPRank: mp, MaxAckPending: 1024, AckWait: 5 * time.Minute,
		PullMaxMessages: 64, PullMaxBytes: 32 << 20, MaxBatchBytes: 1 << 30, ChunkTimeout: 2 * time.Minute}
}

// Validate checks the fields.
func (c ConsumerConfig) Validate() error {
	if _, err := BatchSubject(c.Job, c.DPRank, c.MPRank); err != nil {
		return err
	}
	if c.MaxAckPending < 1 || c.AckWait <= 0 || c.PullMaxBytes < 0 || (c.PullMaxBytes == 0 && c.PullMaxMessages < 1) ||
		c.MaxBatchBytes <= 0 || c.ChunkTimeout <= 0 {
		return fmt.Errorf("proto: consumer config %+v: %w", c, ErrInvalidConfig)
	}
	return nil
}

// EnsureConsumer creates or updates the durable pull consumer of one rank:
// name ConsumerName, filter on the rank's batch subject, explicit acks,
// MaxAckPending prefetch, unlimited redeliveries.
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, cfg ConsumerConfig) (jetstream.Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	subj, _ := BatchSubject(cfg.Job, cfg.DPRank, cfg.MPRank)
	name := ConsumerName(cfg.Job, cfg.DPRank, cfg.MPRank)
	c, err := js.CreateOrUpdateConsumer(ctx, StreamName(cfg.Job), jetstream.ConsumerConfig{
		Durable:       name,
		FilterSubject: subj,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxAckPending: cfg.MaxAckPending,
		MaxDeliver:    -1,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("proto: ensure consumer %s: %w", name, err)
	}
	return c, nil
}

// KV keys of the job bucket.
const (
	// KVConfig holds the job configuration (JSON, written by the service).
	KVConfig = "config"
	// KVEpoch holds the current epoch (decimal).
	KVEpoch = "epoch"
)

// KVRankStep returns the key of rank (dp, mp)'s last completed step:
// rank.<dp>.<mp>.step; the value is "<epoch>.<step>".
func KVRankStep(dp, mp int) string {
	return "rank." + strconv.Itoa(dp) + "." + strconv.Itoa(mp) + ".step"
}

// EnsureKV creates or updates the job's KV bucket mmfeed_<job> (history 1).
func EnsureKV(ctx context.Context, js jetstream.JetStream, job string, memory bool, replicas int) (jetstream.KeyValue, error) {
	if err := ValidateJob(job); err != nil {
		return nil, err
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      BucketName(job),
		Description: "mmfeed service state of job " + job,
		History:     1,
		Storage:     storage(memory),
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("proto: ensure kv %s: %w", BucketName(job), err)
	}
	return kv, nil
}

// PutRankStep records that rank (dp, mp) completed step of epoch.
func PutRankStep(ctx context.Context, kv jetstream.KeyValue, dp, mp, epoch, step int) error {
	if _, err := kv.Put(ctx, KVRankStep(dp, mp), []byte(strconv.Itoa(epoch)+"."+strconv.Itoa(step))); err != nil {
		return fmt.Errorf("proto: kv put rank %d.%d step: %w", dp, mp, err)
	}
	return nil
}

// GetRankStep returns rank (dp, mp)'s last completed (epoch, step); ok is
// false when none was recorded.
func GetRankStep(ctx context.Context, kv jetstream.KeyValue, dp, mp int) (epoch, step int, ok bool, err error) {
	e, err := kv.Get(ctx, KVRankStep(dp, mp))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, false, nil
	}
	if err != nil {
		return 0, 0, false, fmt.Errorf("proto: kv get rank %d.%d step: %w", dp, mp, err)
	}
	var es, ss string
	var found bool
	if es, ss, found = strings.Cut(string(e.Value()), "."); !found {
		return 0, 0, false, fmt.Errorf("proto: kv rank %d.%d step %q: %w", dp, mp, e.Value(), ErrControl)
	}
	epoch, err1 := parseNonNeg(es)
	step, err2 := parseNonNeg(ss)
	if err1 != nil || err2 != nil {
		return 0, 0, false, fmt.Errorf("proto: kv rank %d.%d step %q: %w", dp, mp, e.Value(), ErrControl)
	}
	return epoch, step, true, nil
}
