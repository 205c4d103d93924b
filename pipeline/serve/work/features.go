package work

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// FeatureBucket is the object store of cached features, shared by every
// job: one object "features-<fingerprint>" per dataset fingerprint.
const FeatureBucket = "mmfeed_features"

// featureRange is how many index entries one feature item covers: its
// result (about 100 bytes an entry) fits a default 1 MB max_payload.
const featureRange = 512

// featureReissue is how long the planner waits for a feature item before it
// issues it again (a purged queue, a worker that never answers).
const featureReissue = 30 * time.Second

// featureResults collects the results of the feature items in flight, and
// the workers' failure reports of them. Only the items of a pass in
// progress (expect) are taken, each with its entry count.
type featureResults struct {
	log     *slog.Logger
	replyOK func(*nats.Msg) bool // whether a result's reply subject may be answered (GuardReplies)
	rejects *rejectCounts        // the planner's
	mu      sync.Mutex
	want    map[string]int                      // entries of the items in flight, by id
	got     map[string][]pipeline.EntryFeatures // by item id
	fails   map[string]featureFailure           // by item id, until its result comes
	// rejected are the items a result was rejected for since they were
	// last issued (the pass issues them again).
	rejected map[string]bool
	changed  chan struct{}
	// failureReports counts the failure reports of items in flight.
	failureReports atomic.Int64
}

// featureFailure counts a feature item's failure reports and keeps the last
// reason.
type featureFailure struct {
	n      int
	reason string
}

func newFeatureResults(log *slog.Logger, rejects *rejectCounts) *featureResults {
	return &featureResults{log: log, replyOK: workerReply, rejects: rejects, want: map[string]int{}, got: map[string][]pipeline.EntryFeatures{},
		fails: map[string]featureFailure{}, rejected: map[string]bool{}, changed: make(chan struct{})}
}

// handle stores one worker's result and answers it, or counts a failure
// report (HdrError; not answered). A result of an item not in flight
// is answered ok and dropped; one with another entry count than its item's
// is rejected (counted with reason rows) and the item issued again.
func (fr *featureResults) handle(m *nats.Msg) {
	if !fr.replyOK(m) {
		return // its answer would go elsewhere than a worker's inbox: not taken
	}
	id := m.Header.Get(HdrItem)
	if reason := m.Header.Get(HdrError); reason != "" {
		fr.failed(id, reason)
		return
	}
	var feats []pipeline.EntryFeatures
	if err := json.Unmarshal(m.Data, &feats); err != nil || id == "" {
		_ = m.Respond([]byte("bad result"))
		return
	}
	answer := AnswerOK
	fr.mu.Lock()
	n, wanted := fr.want[id]
	_, have := fr.got[id]
	switch {
	case !wanted || have: // no longer wanted, or a second result
	case len(feats) != n:
		fr.rejects.inc(RejectRows)
		fr.rejected[id] = true
		answer = fmt.Sprintf("%s rows: %d entries, the item has %d", AnswerRejected, len(feats), n)
		fr.log.Warn("feature result rejected: it does not match the item issued; the item is issued again", "item", id,
			"reason", RejectRows, "entries", len(feats), "want", n)
		fr.wakeLocked()
	default:
		fr.got[id] = feats
		fr.wakeLocked()
	}
	fr.mu.Unlock()
	_ = m.Respond([]byte(answer))
}

func (fr *featureResults) wakeLocked() {
	close(fr.changed)
	fr.changed = make(chan struct{})
}

// failed counts a failure report of a feature item the planner waits for.
func (fr *featureResults) failed(id, reason string) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if _, ok := fr.got[id]; ok || fr.want[id] == 0 {
		return
	}
	fr.failureReports.Add(1)
	f := fr.fails[id]
	f.n++
	f.reason = Truncate(reason, MaxReasonBytes)
	fr.fails[id] = f
	fr.log.Warn("feature item failed on a worker", "item", id, "failures", f.n, "max", ItemMaxFailures, "reason", f.reason)
	fr.wakeLocked()
}

// expect makes the items of a pass in flight.
func (fr *featureResults) expect(items []FeatureItem) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	for _, it := range items {
		fr.want[it.ID] = it.Hi - it.Lo
	}
}

// pending returns the items of a pass still without a result, those of
// them to issue again at once (a result was rejected), the last failure
// reported of them, and the channel closed at the next change. It fails
// with ErrWorkFailed once an item has ItemMaxFailures failure reports.
func (fr *featureResults) pending(items []FeatureItem) (missing, again []FeatureItem, last string, changed <-chan struct{}, err error) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	for _, it := range items {
		if _, ok := fr.got[it.ID]; ok {
			continue
		}
		missing = append(missing, it)
		if fr.rejected[it.ID] {
			delete(fr.rejected, it.ID)
			again = append(again, it)
		}
		if f := fr.fails[it.ID]; f.n >= ItemMaxFailures {
			return nil, nil, "", nil, fmt.Errorf("serve: feature item [%d, %d) failed %d times on the workers, last: %s: %w",
				it.Lo, it.Hi, f.n, f.reason, ErrWorkFailed)
		} else if f.n > 0 {
			last = f.reason
		}
	}
	return missing, again, last, fr.changed, nil
}

// forget drops what is left of a pass's items.
func (fr *featureResults) forget(items []FeatureItem) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	for _, it := range items {
		delete(fr.want, it.ID)
		delete(fr.got, it.ID)
		delete(fr.fails, it.ID)
		delete(fr.rejected, it.ID)
	}
}

// FeatureCache is the service's pipeline.FeatureCache: one object
// "features-<fingerprint>" (gzipped JSON) in FeatureBucket, shared by every
// job and role on the deployment, so a restart, a standby planner or a
// second job on the same data reads the features instead of computing them.
type FeatureCache struct {
	js       jetstream.JetStream
	replicas int
	log      *slog.Logger
	// hits and misses count the Loads that found features and those that
	// did not (the features were then computed).
	hits, misses atomic.Int64
}

// NewFeatureCache is the feature cache in FeatureBucket on js, with
// replicas replicas.
func NewFeatureCache(js jetstream.JetStream, replicas int, log *slog.Logger) *FeatureCache {
	return &FeatureCache{js: js, replicas: replicas, log: log}
}

// Hits and Misses count the Loads that found features and those that did
// not (the features were then computed).
func (c *FeatureCache) Hits() int64   { return c.hits.Load() }
func (c *FeatureCache) Misses() int64 { return c.misses.Load() }

func (c *FeatureCache) bucket(ctx context.Context) (jetstream.ObjectStore, error) {
	obj, err := c.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: FeatureBucket,
		Description: "mmfeed features by dataset fingerprint", Storage: jetstream.FileStorage,
		Replicas: max(c.replicas, 1)})
	if err != nil {
		return nil, fmt.Errorf("serve: feature bucket: %w", err)
	}
	return obj, nil
}

// Load reads the fingerprint's object. A cache that cannot be read is
// logged and skipped (the dataset computes the features).
func (c *FeatureCache) Load(ctx context.Context, fp string) (all []pipeline.EntryFeatures, ok bool, err error) {
	defer func() {
		if err != nil {
			c.log.Warn("feature cache not read: computing the features", "fingerprint", fp, "err", err)
		}
	}()
	obj, err := c.bucket(ctx)
	if err != nil {
		c.misses.Add(1)
		return nil, false, err
	}
	r, err := obj.Get(ctx, "features-"+fp)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		c.misses.Add(1)
		return nil, false, nil
	}
	if err != nil {
		c.misses.Add(1)
		return nil, false, fmt.Errorf("serve: cached features: %w", err)
	}
	defer r.Close()
	all, err = pipeline.ReadFeatures(r)
	if err != nil {
		c.misses.Add(1)
		return nil, false, fmt.Errorf("serve: cached features: %w", err)
	}
	c.hits.Add(1)
	c.log.Info("features from the cache", "fingerprint", fp, "entries", len(all))
	return all, true, nil
}

// Store puts the fingerprint's object; a failure is logged.
func (c *FeatureCache) Store(ctx context.Context, fp string, all []pipeline.EntryFeatures) (err error) {
	defer func() {
		if err != nil {
			c.log.Warn("features not cached", "fingerprint", fp, "err", err)
		}
	}()
	obj, err := c.bucket(ctx)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if err := pipeline.WriteFeatures(&b, all); err != nil {
		return err
	}
	if _, err := obj.PutBytes(ctx, "features-"+fp, b.Bytes()); err != nil {
		return fmt.Errorf("serve: cache features: %w", err)
	}
	c.log.Info("features cached", "fingerprint", fp, "entries", len(all), "bytes", b.Len())
	return nil
}

// Features is the planner's pipeline.FeatureFunc: the workers compute the
// features (feature items); the job's dataset reads and fills the cache
// around it, once per job.
func (w *Planner) Features(ctx context.Context, ix *loader.Index) ([]pipeline.EntryFeatures, error) {
	t0 := time.Now()
	all, err := w.featurePass(ctx, ix)
	if err != nil {
		return nil, err
	}
	secs := time.Since(t0).Seconds()
	w.log.Info("features from the workers", "entries", len(all), "items", (len(all)+featureRange-1)/featureRange,
		"seconds", secs)
	w.mu.Lock()
	w.featureEntries, w.featureSeconds = w.featureEntries+len(all), w.featureSeconds+secs
	w.mu.Unlock()
	return all, nil
}

// featurePass issues one feature item per featureRange entries of ix and
// assembles the results in index order; an item unanswered after
// featureReissue is issued again, one whose result was rejected at once.
// It fails with ErrWorkFailed when the workers reported one item failed
// ItemMaxFailures times.
func (w *Planner) featurePass(ctx context.Context, ix *loader.Index) ([]pipeline.EntryFeatures, error) {
	var items []FeatureItem
	for lo := 0; lo < ix.Len(); lo += featureRange {
		hi := min(lo+featureRange, ix.Len())
		it := FeatureItem{Kind: "features", Config: w.config, Job: w.job, Lo: lo, Hi: hi,
			FirstID: ix.ID(lo), LastID: ix.ID(hi - 1), DeadlineMS: featureReissue.Milliseconds()}
		b, _ := json.Marshal(it)
		sum := sha256.Sum256(b)
		it.ID = hex.EncodeToString(sum[:16])
		items = append(items, it)
	}
	issue := func(missing []FeatureItem) error {
		for _, it := range missing {
			b, err := json.Marshal(it)
			if err != nil {
				return err
			}
			if err := w.publish(ctx, b); err != nil {
				return fmt.Errorf("serve: issue feature item: %w", err)
			}
		}
		return nil
	}
	fr := w.feats
	fr.expect(items)
	defer fr.forget(items)
	if err := issue(items); err != nil {
		return nil, err
	}
	for {
		missing, again, last, ch, err := fr.pending(items)
		if err != nil {
			return nil, err
		}
		if len(missing) == 0 {
			break
		}
		if err := issue(again); err != nil {
			return nil, err
		}
		t := time.NewTimer(featureReissue)
		select {
		case <-ch:
			t.Stop()
		case <-t.C:
			w.log.Warn("waiting for workers: feature items issued again", "missing", len(missing), "items", len(items),
				"last_failure", last)
			if err := issue(missing); err != nil {
				return nil, err
			}
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	all := make([]pipeline.EntryFeatures, 0, ix.Len())
	for _, it := range items {
		part := fr.got[it.ID]
		if len(part) != it.Hi-it.Lo {
			return nil, fmt.Errorf("serve: feature item [%d, %d) came back with %d entries: %w", it.Lo, it.Hi, len(part), ErrState)
		}
		all = append(all, part...)
	}
	return all, nil
}
