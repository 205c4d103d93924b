package work

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
)

// workerDataset is a dataset opened by a worker for one preprocessing config.
type workerDataset struct {
	ds   *pipeline.Dataset
	pp   *pipeline.Preprocessor
	byID map[string]int
	// users is how many items use it now, used when one last took it
	// (guarded by worker.mu).
	users int
	used  time.Time
}

// entry returns the index position of the sample a batch item names: its
// id, or for a mixture's repeated draw (loader.DrawID "<id>#<k>") the
// sample it repeats. The planner's index quarantines ids that could be
// read both ways (loader.CombineIndexes), so the lookup is unambiguous.
func (d *workerDataset) entry(id string) (int, bool) {
	if j, ok := d.byID[id]; ok {
		return j, true
	}
	if d.ds.Config.Mixture == nil {
		return 0, false
	}
	base, _, ok := loader.DrawBase(id)
	if !ok {
		return 0, false
	}
	j, ok := d.byID[base]
	return j, ok
}

// maxDatasets is how many datasets a worker keeps open: beyond it, the
// least recently used one that no item uses is closed (a worker serves
// any number of jobs over its life).
const maxDatasets = 4

// dataset returns the worker's dataset of a job's config, opening it (and
// fetching the config and tokenizer) the first time; the caller calls
// release when its item is done with it.
func (w *Worker) dataset(ctx context.Context, job, hash string) (d *workerDataset, release func(), err error) {
	k := job + "/" + hash
	take := func(d *workerDataset) (*workerDataset, func(), error) { // w.mu held
		d.users++
		d.used = time.Now()
		return d, func() {
			w.mu.Lock()
			d.users--
			w.mu.Unlock()
		}, nil
	}
	w.mu.Lock()
	if d := w.datasets[k]; d != nil {
		defer w.mu.Unlock()
		return take(d)
	}
	lk := w.opening[k]
	if lk == nil {
		lk = &sync.Mutex{}
		w.opening[k] = lk
	}
	w.mu.Unlock()
	lk.Lock() // one slot opens it, the others wait for it
	defer lk.Unlock()
	w.mu.Lock()
	if d := w.datasets[k]; d != nil {
		defer w.mu.Unlock()
		return take(d)
	}
	w.mu.Unlock()
	if d, err = w.open(ctx, job, hash); err != nil {
		return nil, nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.datasets[k] = d
	w.evictLocked(k)
	return take(d)
}

// evictLocked closes least recently used datasets nobody uses (keep
// excepted) while there are more than maxDatasets. The caller holds w.mu.
func (w *Worker) evictLocked(keep string) {
	for len(w.datasets) > maxDatasets {
		victim := ""
		for k, d := range w.datasets {
			if k != keep && d.users == 0 && (victim == "" || d.used.Before(w.datasets[victim].used)) {
				victim = k
			}
		}
		if victim == "" {
			return
		}
		_ = w.datasets[victim].ds.Close()
		delete(w.datasets, victim)
		delete(w.opening, victim)
		w.log.Info("closed dataset", "key", victim)
	}
}

func (w *Worker) open(ctx context.Context, job, hash string) (*workerDataset, error) {
	octx, stop := w.refused.watch(ctx, workBucketInfo(job))
	obj, err := w.js.ObjectStore(octx, Bucket(job))
	stop()
	if err != nil {
		return nil, fmt.Errorf("serve: work bucket of %s: %w", job, err)
	}
	b, err := obj.GetBytes(ctx, "config-"+hash)
	if err != nil {
		return nil, fmt.Errorf("serve: config %s of %s: %w", hash, job, err)
	}
	var wc Config
	if err := json.Unmarshal(b, &wc); err != nil {
		return nil, fmt.Errorf("serve: config %s of %s: %w", hash, job, err)
	}
	tokPath := filepath.Join(w.cacheDir, "tokenizer-"+wc.TokenizerSHA+".json")
	if _, err := os.Stat(tokPath); err != nil {
		tok, err := obj.GetBytes(ctx, "tokenizer-"+wc.TokenizerSHA)
		if err != nil {
			return nil, fmt.Errorf("serve: tokenizer of %s: %w", job, err)
		}
		if err := os.WriteFile(tokPath, tok, 0o644); err != nil {
			return nil, fmt.Errorf("serve: tokenizer cache: %w", err)
		}
	}
	var qw io.Writer // rejects found here go to the job's quarantine bucket, once per sample
	if kv, err := w.js.KeyValue(ctx, natsenv.QuarantineBucket(job)); err == nil {
		qw = NewQuarantineSink(kv, w.log, false)
	} else {
		w.log.Warn("quarantine bucket", "job", job, "err", err)
	}
	t0 := time.Now()
	ds, err := pipeline.OpenDataset(ctx, wc.pipelineConfig(tokPath), qw)
	if err != nil {
		if ctx.Err() == nil {
			err = fmt.Errorf("%w (%w)", err, errInput)
		}
		return nil, fmt.Errorf("serve: open dataset of %s: %w", job, err)
	}
	pp := ds.Preprocessor()
	byID := make(map[string]int, ds.Index.Len())
	for i := range ds.Index.Len() {
		byID[ds.Index.ID(i)] = i
	}
	w.log.Info("opened dataset", "job", job, "config", hash, "input", wc.Input, "entries", len(byID),
		"seconds", time.Since(t0).Seconds())
	return &workerDataset{ds: ds, pp: pp, byID: byID}, nil
}
