package serve

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

// The work queue: one JetStream work-queue stream for every job's items,
// one durable pull consumer that every worker shares.
const (
	// WorkStream is the work-queue stream of every job's work items.
	WorkStream = natsenv.WorkStream
	// WorkConsumer is the workers' shared durable consumer of WorkStream.
	WorkConsumer = natsenv.WorkConsumer
	workPrefix   = natsenv.WorkPrefix
)

// Headers of a worker's result messages.
const (
	hdrWorkItem    = "Mmfeed-Work-Item"    // the item's id (batchItem.ID)
	hdrWorkDone    = "Mmfeed-Work-Done"    // on the done message: every payload was sent
	hdrWorkSeconds = "Mmfeed-Work-Seconds" // on the done message: the worker's time for the item
	hdrWorkSlots   = "Mmfeed-Work-Slots"   // on the done message: the worker's slots (autoscale.go)
	// hdrWorkConfig, on every chunk: the preprocessing config hash the
	// worker built the rows with.
	hdrWorkConfig = "Mmfeed-Work-Config"
	// hdrWorkError, on a failure report (no payload): why the worker could
	// not build the item (its dataset did not open, an id is not in its
	// index, ...). The worker leaves the item to another attempt.
	hdrWorkError = "Mmfeed-Work-Error"
)

// The planner's answers to a worker's done message.
const (
	answerOK       = "ok"        // held, or no longer wanted
	answerMissing  = "missing"   // chunks were lost: send them again
	answerRejected = "rejected:" // a result did not match the item; the planner issued it again
)

// maxReasonBytes bounds the failure reason a planner keeps and logs.
const maxReasonBytes = 512

// workItemsSubject is where a job's work items are published.
func workItemsSubject(job string) string { return natsenv.WorkItemsSubject(job) }

// workResultSubject is where workers send a job's results (core NATS).
func workResultSubject(job string) string { return natsenv.WorkResultSubject(job) }

// WorkBucket is the object store of a job's preprocessing configs and
// tokenizer files, which batch items name by hash.
func WorkBucket(job string) string { return natsenv.WorkBucket(job) }

// workSample is one planned sample of a batch item: the row as the plan has
// it (the worker adds token ids and the image tensor).
type workSample struct {
	ID          string  `json:"id"`
	TextTokens  int32   `json:"tt"`
	ImageTokens int32   `json:"it"`
	Cost        float64 `json:"c"`
	Weight      float32 `json:"w"`
}

// sampleOf is the planned row r (pipeline.PlannedRow) as an item carries it.
func sampleOf(r proto.Row) workSample {
	return workSample{ID: r.ID, TextTokens: r.TextTokens, ImageTokens: r.ImageTokens, Cost: r.Cost, Weight: r.Weight}
}

// row is the planned row the sample carries, as the worker preprocesses it.
func (s workSample) row() proto.Row {
	return proto.Row{ID: s.ID, TextTokens: s.TextTokens, ImageTokens: s.ImageTokens, Cost: s.Cost, Weight: s.Weight}
}

// batchItem is one micro-batch of one dp rank to preprocess and encode, for
// every mp rank of it.
type batchItem struct {
	Kind string `json:"kind"` // "batch"
	// ID names the item's content (a hash of everything below): a result is
	// accepted only for the item the planner waits for.
	ID string `json:"id"`
	// Config is the hash of the preprocessing config (workConfig), an
	// object "config-<hash>" in the job's WorkBucket.
	Config     string `json:"config"`
	Job        string `json:"job"`
	Epoch      int    `json:"epoch"`
	Step       int    `json:"step"`
	DP         int    `json:"dp"`
	MicroBatch int    `json:"mb"`
	// Metas are the batch metadata of each mp rank (MicroBatch set).
	Metas   []proto.BatchMeta `json:"metas"`
	Samples []workSample      `json:"samples"`
	// PredictedMS is the planner's prediction of the item's time on one
	// worker core (0: none yet); DeadlineMS is how long a worker keeps the
	// item to itself (it renews its ack deadline until then; a worker that
	// dies stops renewing and the item is redelivered).
	PredictedMS int64 `json:"predicted_ms"`
	DeadlineMS  int64 `json:"deadline_ms"`
}

func (it *batchItem) key() workKey { return workKey{it.Epoch, it.Step, it.DP, it.MicroBatch} }

// seal sets ID from the content.
func (it *batchItem) seal() error {
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
func (it *batchItem) validate() error {
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

// featureItem is a range of a job's dataset index whose features (token
// counts, image headers) a worker computes.
type featureItem struct {
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

// workFeaturesSubject is where workers send a job's feature results.
func workFeaturesSubject(job string) string { return natsenv.WorkFeaturesSubject(job) }

// workKey names a batch item's place: (epoch, step, dp, micro-batch).
type workKey struct{ Epoch, Step, DP, MicroBatch int }

// workLoader is loader.Options as JSON: its OnReject callback is hidden by
// a shallower field that is always nil (omitted).
type workLoader struct {
	loader.Options
	OnReject *struct{} `json:"OnReject,omitempty"`
}

// workConfig is everything a worker needs besides a batch item to build its
// rows: the dataset and how to read it, the tokenizer (its file by hash) and
// the image policy.
type workConfig struct {
	Input             string          `json:"input"`
	Mixture           *loader.Mixture `json:"mixture,omitempty"`
	Loader            workLoader      `json:"loader"`
	Tokenizer         tokenize.Config `json:"tokenizer"`
	TokenizerSHA      string          `json:"tokenizer_sha256"`
	Image             imgproc.Config  `json:"image"`
	MaxPixelsInFlight int64           `json:"max_pixels_in_flight"`
}

// newWorkConfig returns the job's preprocessing config and the bytes of its
// tokenizer file.
func newWorkConfig(pc pipeline.Config) (workConfig, []byte, error) {
	path := pc.Tokenizer.Path
	if path == "" {
		p, err := tokenize.DefaultTokenizerPath()
		if err != nil {
			return workConfig{}, nil, err
		}
		path = p
	}
	tok, err := os.ReadFile(path)
	if err != nil {
		return workConfig{}, nil, fmt.Errorf("serve: tokenizer for the workers: %w", err)
	}
	sum := sha256.Sum256(tok)
	tc := pc.Tokenizer
	tc.Path = ""
	return workConfig{Input: pc.Input, Mixture: pc.Mixture, Loader: workLoader{Options: pc.Loader}, Tokenizer: tc,
		TokenizerSHA: hex.EncodeToString(sum[:]), Image: pc.Image, MaxPixelsInFlight: pc.MaxPixelsInFlight}, tok, nil
}

// hash names the config.
func (c workConfig) hash() (string, []byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", nil, fmt.Errorf("serve: work config: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16]), b, nil
}

// pipelineConfig is the config a worker opens the dataset with; tokenizer
// is the path of the tokenizer file it fetched.
func (c workConfig) pipelineConfig(tokenizer string) pipeline.Config {
	pc := pipeline.DefaultConfig()
	pc.Input, pc.Loader, pc.Tokenizer, pc.Image, pc.MaxPixelsInFlight = c.Input, c.Loader.Options, c.Tokenizer, c.Image, c.MaxPixelsInFlight
	pc.Mixture = c.Mixture
	pc.Tokenizer.Path = tokenizer
	pc.Workers = 1
	return pc
}

// ensureWorkQueue creates (or updates) the work-queue stream and the
// workers' consumer: ackWait is how long a worker may go without renewing
// an item before it is redelivered.
func ensureWorkQueue(ctx context.Context, js jetstream.JetStream, replicas int, ackWait time.Duration) (jetstream.Stream, error) {
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: WorkStream,
		Description: "mmfeed work items of every job (batch items), taken by any worker",
		Subjects:    []string{workPrefix + ".*.items"}, Retention: jetstream.WorkQueuePolicy,
		Storage: jetstream.FileStorage, Replicas: max(replicas, 1)})
	if err != nil {
		return nil, fmt.Errorf("serve: work stream: %w", err)
	}
	_, err = st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: WorkConsumer,
		Description: "mmfeed workers", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
		MaxAckPending: 4096, MaxDeliver: -1, FilterSubject: workPrefix + ".*.items", Replicas: max(replicas, 1)})
	if err != nil {
		return nil, fmt.Errorf("serve: work consumer: %w", err)
	}
	return st, nil
}

// ensureWorkBucket creates the job's object store and puts cfg and its
// tokenizer file in it; it returns cfg's hash.
func ensureWorkBucket(ctx context.Context, js jetstream.JetStream, job string, replicas int, cfg workConfig, tok []byte) (string, error) {
	obj, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: WorkBucket(job),
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

// truncate bounds s (a subject or a reason from outside) to n bytes for a
// log line or a header, cut at a valid UTF-8 boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + fmt.Sprintf("…(%d bytes)", len(s))
}

// encodeRows builds one micro-batch's record from rows and encodes it as an
// Arrow IPC payload, the one way served batches and work results are made;
// build and encode are the times the two took.
func encodeRows(mem memory.Allocator, meta proto.BatchMeta, rows []proto.Row) (payload []byte, build, encode time.Duration, err error) {
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
