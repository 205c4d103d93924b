package serve

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
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
func workFeaturesSubject(job string) string { return workPrefix + "." + job + ".features" }

// featureResults collects the results of the feature items in flight.
type featureResults struct {
	mu      sync.Mutex
	got     map[string][]pipeline.EntryFeatures // by item id
	changed chan struct{}
}

func newFeatureResults() *featureResults {
	return &featureResults{got: map[string][]pipeline.EntryFeatures{}, changed: make(chan struct{})}
}

// handle stores one worker's result and answers it.
func (fr *featureResults) handle(m *nats.Msg) {
	id := m.Header.Get(hdrWorkItem)
	var feats []pipeline.EntryFeatures
	if err := json.Unmarshal(m.Data, &feats); err != nil || id == "" {
		_ = m.Respond([]byte("bad result"))
		return
	}
	fr.mu.Lock()
	if _, ok := fr.got[id]; !ok {
		fr.got[id] = feats
		close(fr.changed)
		fr.changed = make(chan struct{})
	}
	fr.mu.Unlock()
	_ = m.Respond([]byte("ok"))
}

// features is the planner's pipeline.FeatureFunc: the features of the
// dataset's fingerprint from the feature bucket, or else computed by the
// workers (feature items) and stored there.
func (s *Service) features(ctx context.Context, ix *loader.Index) ([]pipeline.EntryFeatures, error) {
	fp, err := datasetFingerprint(s.cfg.Pipeline)
	if err != nil {
		s.log.Warn("no dataset fingerprint: features are not cached", "err", err)
	}
	var obj jetstream.ObjectStore
	name := "features-" + fp
	if fp != "" {
		if obj, err = s.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: FeatureBucket,
			Description: "mmfeed features by dataset fingerprint", Storage: jetstream.FileStorage,
			Replicas: max(s.cfg.Replicas, 1)}); err != nil {
			return nil, fmt.Errorf("serve: feature bucket: %w", err)
		}
		if b, err := obj.GetBytes(ctx, name); err == nil {
			var all []pipeline.EntryFeatures
			if err := json.Unmarshal(b, &all); err == nil && len(all) == len(ix.Entries) {
				s.log.Info("features from the cache", "fingerprint", fp, "entries", len(all))
				s.work.featureHits.Add(1)
				return all, nil
			}
			s.log.Warn("cached features do not fit the index: recomputing", "fingerprint", fp)
		} else if !errors.Is(err, jetstream.ErrObjectNotFound) {
			return nil, fmt.Errorf("serve: cached features: %w", err)
		}
	}
	t0 := time.Now()
	s.work.featureMisses.Add(1)
	all, err := s.featurePass(ctx, ix)
	if err != nil {
		return nil, err
	}
	secs := time.Since(t0).Seconds()
	s.log.Info("features from the workers", "entries", len(all), "items", (len(all)+featureRange-1)/featureRange,
		"seconds", secs)
	s.work.mu.Lock()
	s.work.featureEntries, s.work.featureSeconds = s.work.featureEntries+len(all), s.work.featureSeconds+secs
	s.work.mu.Unlock()
	if obj != nil {
		b, err := json.Marshal(all)
		if err == nil {
			_, err = obj.PutBytes(ctx, name, b)
		}
		if err != nil {
			s.log.Warn("features not cached", "err", err)
		}
	}
	return all, nil
}

// featurePass issues one feature item per featureRange entries of ix and
// assembles the results in index order; an item unanswered after
// featureReissue is issued again.
func (s *Service) featurePass(ctx context.Context, ix *loader.Index) ([]pipeline.EntryFeatures, error) {
	w := s.work
	var items []featureItem
	for lo := 0; lo < len(ix.Entries); lo += featureRange {
		hi := min(lo+featureRange, len(ix.Entries))
		it := featureItem{Kind: "features", Config: w.config, Job: w.job, Lo: lo, Hi: hi,
			FirstID: ix.Entries[lo].ID, LastID: ix.Entries[hi-1].ID, DeadlineMS: featureReissue.Milliseconds()}
		b, _ := json.Marshal(it)
		sum := sha256.Sum256(b)
		it.ID = hex.EncodeToString(sum[:16])
		items = append(items, it)
	}
	issue := func(missing []featureItem) error {
		for _, it := range missing {
			b, err := json.Marshal(it)
			if err != nil {
				return err
			}
			if _, err := w.js.Publish(ctx, workItemsSubject(w.job), b); err != nil {
				return fmt.Errorf("serve: issue feature item: %w", err)
			}
		}
		return nil
	}
	if err := issue(items); err != nil {
		return nil, err
	}
	fr := w.feats
	for {
		fr.mu.Lock()
		var missing []featureItem
		for _, it := range items {
			if _, ok := fr.got[it.ID]; !ok {
				missing = append(missing, it)
			}
		}
		ch := fr.changed
		fr.mu.Unlock()
		if len(missing) == 0 {
			break
		}
		t := time.NewTimer(featureReissue)
		select {
		case <-ch:
			t.Stop()
		case <-t.C:
			s.log.Warn("waiting for workers: feature items issued again", "missing", len(missing), "items", len(items))
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
	all := make([]pipeline.EntryFeatures, 0, len(ix.Entries))
	for _, it := range items {
		part := fr.got[it.ID]
		delete(fr.got, it.ID)
		if len(part) != it.Hi-it.Lo {
			return nil, fmt.Errorf("serve: feature item [%d, %d) came back with %d entries: %w", it.Lo, it.Hi, len(part), ErrState)
		}
		all = append(all, part...)
	}
	return all, nil
}

// datasetFingerprint names what the features depend on: the preprocessing
// settings, the tokenizer file's hash, and the size and modification time
// of the input's files (the manifest, the shards, or every file of a
// folder; images a manifest names are not looked at: replace a manifest's
// image in place and touch the manifest).
func datasetFingerprint(pc pipeline.Config) (string, error) {
	wc, _, err := newWorkConfig(pc)
	if err != nil {
		return "", err
	}
	wc.MaxPixelsInFlight = 0
	h := sha256.New()
	b, err := json.Marshal(wc)
	if err != nil {
		return "", err
	}
	h.Write(b)
	files, err := inputFiles(pc.Input)
	if err != nil {
		return "", err
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "\n%s %d %d", f, st.Size(), st.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil)[:16]), nil
}

// inputFiles lists the files of an input: itself, a folder's files, or a
// glob's matches.
func inputFiles(input string) ([]string, error) {
	st, err := os.Stat(input)
	if err == nil && !st.IsDir() {
		return []string{input}, nil
	}
	if err == nil {
		var out []string
		err := filepath.WalkDir(input, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				out = append(out, p)
			}
			return nil
		})
		return out, err
	}
	m, gerr := filepath.Glob(input)
	if gerr != nil || len(m) == 0 {
		return nil, fmt.Errorf("serve: input %s: no files to fingerprint", input)
	}
	return m, nil
}
