package work

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/mmfeed/mmfeed/tokenize"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrJobMismatch: a worker's index of a job's input is not the planner's
// (a sample id or a feature range the item names is not in it); serve's
// ErrJobMismatch is this value.
var ErrJobMismatch = errors.New("job state does not match this configuration")

// ErrState: the planner met a state it never made (an item waited for that
// it never issued, a feature result of another size than its item's);
// serve's ErrState is this value.
var ErrState = errors.New("malformed service state")

// The work queue: one JetStream work-queue stream for every job's items,
// one durable pull consumer that every worker shares.
const (
	// Stream is the work-queue stream of every job's work items.
	Stream = natsenv.WorkStream
	// Consumer is the workers' shared durable consumer of Stream.
	Consumer = natsenv.WorkConsumer
	prefix   = natsenv.WorkPrefix
)

// Headers of a worker's result messages.
const (
	HdrItem    = "Mmfeed-Work-Item"    // the item's id (BatchItem.ID)
	HdrDone    = "Mmfeed-Work-Done"    // on the done message: every payload was sent
	HdrSeconds = "Mmfeed-Work-Seconds" // on the done message: the worker's time for the item
	HdrSlots   = "Mmfeed-Work-Slots"   // on the done message: the worker's slots (serve's autoscale.go)
	// HdrConfig, on every chunk: the preprocessing config hash the
	// worker built the rows with.
	HdrConfig = "Mmfeed-Work-Config"
	// HdrError, on a failure report (no payload): why the worker could
	// not build the item (its dataset did not open, an id is not in its
	// index, ...). The worker leaves the item to another attempt.
	HdrError = "Mmfeed-Work-Error"
)

// The planner's answers to a worker's done message.
const (
	AnswerOK       = "ok"        // held, or no longer wanted
	AnswerMissing  = "missing"   // chunks were lost: send them again
	AnswerRejected = "rejected:" // a result did not match the item; the planner issued it again
)

// MaxReasonBytes bounds the failure reason a planner keeps and logs.
const MaxReasonBytes = 512

// ItemsSubject is where a job's work items are published.
func ItemsSubject(job string) string { return natsenv.WorkItemsSubject(job) }

// ResultSubject is where workers send a job's results (core NATS).
func ResultSubject(job string) string { return natsenv.WorkResultSubject(job) }

// Bucket is the object store of a job's preprocessing configs and
// tokenizer files, which batch items name by hash.
func Bucket(job string) string { return natsenv.WorkBucket(job) }

// Sample is one planned sample of a batch item: the row as the plan has
// it (the worker adds token ids and the image tensor).
type Sample struct {
	ID          string  `json:"id"`
	TextTokens  int32   `json:"tt"`
	ImageTokens int32   `json:"it"`
	Cost        float64 `json:"c"`
	Weight      float32 `json:"w"`
}

// SampleOf is the planned row r (pipeline.PlannedRow) as an item carries it.
func SampleOf(r proto.Row) Sample {
	return Sample{ID: r.ID, TextTokens: r.TextTokens, ImageTokens: r.ImageTokens, Cost: r.Cost, Weight: r.Weight}
}

// row is the planned row the sample carries, as the worker preprocesses it.
func (s Sample) row() proto.Row {
	return proto.Row{ID: s.ID, TextTokens: s.TextTokens, ImageTokens: s.ImageTokens, Cost: s.Cost, Weight: s.Weight}
}

// BatchItem is one micro-batch of one dp rank to preprocess and encode, for
// every mp rank of it.
type BatchItem struct {
	Kind string `json:"kind"` // "batch"
	// ID names the item's content (a hash of everything below): a result is
	// accepted only for the item the planner waits for.
	ID string `json:"id"`
	// Config is the hash of the preprocessing config (Config), an
	// object "config-<hash>" in the job's Bucket.
	Config     string `json:"config"`
	Job        string `json:"job"`
	Epoch      int    `json:"epoch"`
	Step       int    `json:"step"`
	DP         int    `json:"dp"`
	MicroBatch int    `json:"mb"`
	// Metas are the batch metadata of each mp rank (MicroBatch set).
	Metas   []proto.BatchMeta `json:"metas"`
	Samples []Sample          `json:"samples"`
	// PredictedMS is the planner's prediction of the item's time on one
	// worker core (0: none yet); DeadlineMS is how long a worker keeps the
	// item to itself (it renews its ack deadline until then; a worker that
	// dies stops renewing and the item is redelivered).
	PredictedMS int64 `json:"predicted_ms"`
	DeadlineMS  int64 `json:"deadline_ms"`
}

func (it *BatchItem) key() Key { return Key{it.Epoch, it.Step, it.DP, it.MicroBatch} }

// Seal sets ID from the content.
func (it *BatchItem) Seal() error {
	it.ID = ""
	b, err := json.Marshal(it)
	if err != nil {
		return fmt.Errorf("serve: work item: %w", err)
	}
	sum := sha256.Sum256(b)
	it.ID = hex.EncodeToString(sum[:16])
	return nil
}

// validate checks what a worker reads from the queue.
func (it *BatchItem) validate() error {
	if err := proto.ValidateJob(it.Job); err != nil {
		return err
	}
	switch {
	case it.ID == "" || it.Config == "" || len(it.Metas) == 0 || len(it.Samples) == 0:
		return fmt.Errorf("serve: work item without id, config, metas or samples: %w", proto.ErrControl)
	case it.Epoch < 0 || it.Step < 0 || it.DP < 0 || it.MicroBatch < 0 || it.DeadlineMS < 0:
		return fmt.Errorf("serve: work item %s: negative position or deadline: %w", it.ID, proto.ErrControl)
	}
	for mp, m := range it.Metas {
		k := m.Key()
		if k != (proto.BatchKey{Job: it.Job, Epoch: it.Epoch, Step: it.Step, MicroBatch: it.MicroBatch, DPRank: it.DP, MPRank: mp}) {
			return fmt.Errorf("serve: work item %s: meta %d is for %v: %w", it.ID, mp, k, proto.ErrControl)
		}
	}
	return nil
}

// FeatureItem is a range of a job's dataset index whose features (token
// counts, image headers) a worker computes.
type FeatureItem struct {
	Kind   string `json:"kind"` // "features"
	ID     string `json:"id"`
	Config string `json:"config"`
	Job    string `json:"job"`
	Lo     int    `json:"lo"`
	Hi     int    `json:"hi"`
	// FirstID and LastID are the ids of entries Lo and Hi-1: a worker whose
	// index differs refuses the item.
	FirstID    string `json:"first_id"`
	LastID     string `json:"last_id"`
	DeadlineMS int64  `json:"deadline_ms"`
}

// FeaturesSubject is where workers send a job's feature results.
func FeaturesSubject(job string) string { return natsenv.WorkFeaturesSubject(job) }

// Key names a batch item's place: (epoch, step, dp, micro-batch).
type Key struct{ Epoch, Step, DP, MicroBatch int }

// workLoader is loader.Options as JSON: its OnReject callback is hidden by
// a shallower field that is always nil (omitted).
type workLoader struct {
	loader.Options
	OnReject *struct{} `json:"OnReject,omitempty"`
}

// Config is everything a worker needs besides a batch item to build its
// rows: the dataset and how to read it, the tokenizer (its file by hash) and
// the image policy.
type Config struct {
	Input             string          `json:"input"`
	Mixture           *loader.Mixture `json:"mixture,omitempty"`
	Loader            workLoader      `json:"loader"`
	Tokenizer         tokenize.Config `json:"tokenizer"`
	TokenizerSHA      string          `json:"tokenizer_sha256"`
	Image             imgproc.Config  `json:"image"`
	MaxPixelsInFlight int64           `json:"max_pixels_in_flight"`
}

// NewConfig returns the job's preprocessing config and the bytes of its
// tokenizer file.
func NewConfig(pc pipeline.Config) (Config, []byte, error) {
	path := pc.Tokenizer.Path
	if path == "" {
		p, err := tokenize.DefaultTokenizerPath()
		if err != nil {
			return Config{}, nil, err
		}
		path = p
	}
	tok, err := os.ReadFile(path)
	if err != nil {
		return Config{}, nil, fmt.Errorf("serve: tokenizer for the workers: %w", err)
	}
	sum := sha256.Sum256(tok)
	tc := pc.Tokenizer
	tc.Path = ""
	return Config{Input: pc.Input, Mixture: pc.Mixture, Loader: workLoader{Options: pc.Loader}, Tokenizer: tc,
		TokenizerSHA: hex.EncodeToString(sum[:]), Image: pc.Image, MaxPixelsInFlight: pc.MaxPixelsInFlight}, tok, nil
}

// hash names the config.
func (c Config) hash() (string, []byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", nil, fmt.Errorf("serve: work config: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16]), b, nil
}

// pipelineConfig is the config a worker opens the dataset with; tokenizer
// is the path of the tokenizer file it fetched.
func (c Config) pipelineConfig(tokenizer string) pipeline.Config {
	pc := pipeline.DefaultConfig()
	pc.Input, pc.Loader, pc.Tokenizer, pc.Image, pc.MaxPixelsInFlight = c.Input, c.Loader.Options, c.Tokenizer, c.Image, c.MaxPixelsInFlight
	pc.Mixture = c.Mixture
	pc.Tokenizer.Path = tokenizer
	pc.Workers = 1
	return pc
}

// EnsureQueue creates (or updates) the work-queue stream and the
// workers' consumer: ackWait is how long a worker may go without renewing
// an item before it is redelivered.
func EnsureQueue(ctx context.Context, js jetstream.JetStream, replicas int, ackWait time.Duration) (jetstream.Stream, error) {
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: Stream,
		Description: "mmfeed work items of every job (batch items), taken by any worker",
		Subjects:    []string{prefix + ".*.items"}, Retention: jetstream.WorkQueuePolicy,
		Storage: jetstream.FileStorage, Replicas: max(replicas, 1)})
	if err != nil {
		return nil, fmt.Errorf("serve: work stream: %w", err)
	}
	_, err = st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: Consumer,
		Description: "mmfeed workers", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
		MaxAckPending: 4096, MaxDeliver: -1, FilterSubject: prefix + ".*.items", Replicas: max(replicas, 1)})
	if err != nil {
		return nil, fmt.Errorf("serve: work consumer: %w", err)
	}
	return st, nil
}

// EnsureBucket creates the job's object store and puts cfg and its
// tokenizer file in it; it returns cfg's hash.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, job string, replicas int, cfg Config, tok []byte) (string, error) {
	obj, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: Bucket(job),
		Description: "mmfeed preprocessing configs and tokenizers of job " + job, Storage: jetstream.FileStorage,
		Replicas: max(replicas, 1)})
	if err != nil {
		return "", fmt.Errorf("serve: work bucket: %w", err)
	}
	h, b, err := cfg.hash()
	if err != nil {
		return "", err
	}
	if err := putObjectOnce(ctx, obj, "tokenizer-"+cfg.TokenizerSHA, tok); err != nil {
		return "", err
	}
	if err := putObjectOnce(ctx, obj, "config-"+h, b); err != nil {
		return "", err
	}
	return h, nil
}

// bucketWait bounds how long the planner asks again when a bucket it has
// just created does not answer: on a new cluster the bucket's replicated
// stream elects its leader first, and until then a read of it gets no
// responders (a planner started with the cluster exited on that).
var bucketWait = 30 * time.Second // a variable so tests can shorten it

// putObjectOnce puts b as name unless obj holds it, asking again while the
// bucket is not answering yet (bucketWait).
func putObjectOnce(ctx context.Context, obj jetstream.ObjectStore, name string, b []byte) error {
	deadline := time.Now().Add(bucketWait)
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		err := putObjectAttempt(ctx, obj, name, b)
		if err == nil || !notAnswering(err) || time.Now().Add(delay).After(deadline) {
			return err
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func putObjectAttempt(ctx context.Context, obj jetstream.ObjectStore, name string, b []byte) error {
	if _, err := obj.GetInfo(ctx, name); err == nil {
		return nil
	} else if !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("serve: work bucket %s: %w", name, err)
	}
	if _, err := obj.PutBytes(ctx, name, b); err != nil {
		return fmt.Errorf("serve: work bucket put %s: %w", name, err)
	}
	return nil
}

// notAnswering reports the errors of a stream that has no leader yet.
func notAnswering(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, jetstream.ErrNoStreamResponse)
}

// Truncate bounds s (a subject or a reason from outside) to n bytes for a
// log line or a header, cut at a valid UTF-8 boundary.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + fmt.Sprintf("…(%d bytes)", len(s))
}

// EncodeRows builds one micro-batch's record from rows and encodes it as an
// Arrow IPC payload, the one way served batches and work results are made;
// build and encode are the times the two took.
func EncodeRows(mem memory.Allocator, meta proto.BatchMeta, rows []proto.Row) (payload []byte, build, encode time.Duration, err error) {
	t0 := time.Now()
	rec, err := proto.BuildRecord(mem, meta, rows)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("serve: build %v: %w", meta.Key(), err)
	}
	t1 := time.Now()
	payload, err = proto.EncodeIPC(rec)
	rec.Release()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("serve: encode %v: %w", meta.Key(), err)
	}
	return payload, t1.Sub(t0), time.Since(t1), nil
}
