package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/proto"
)

// Shard writes a dataset once and the plans of o.Epochs epochs beside it, into st:
//
//   - data files: the first epoch's plan (plan), one Arrow IPC file per dp rank (and per
//     part of o.PartSteps steps), in step order, a micro-batch as consecutive records of
//     up to ShardOptions.RecordRows rows (default 1: one sample per record; proto's batch
//     schema, modality "all"; pixels as tensors or JPEG; buffers compressed);
//   - extra.arrow: the samples a later epoch plans that the first epoch left out (its
//     dropped tail), once each;
//   - epoch-%05d.index.arrow per epoch: for every (rank, step, micro-batch) row the data
//     file, record and row of its sample, and the row's weight and cost;
//   - shard.json, the manifest (written last: a set without it is incomplete).
//
// A run that finds progress/ records of an interrupted run with the same fingerprint
// (dataset, config, plan, options) verifies each recorded file (size and SHA-256) and
// keeps it instead of preprocessing its steps again. progress, when not nil, is called
// after each written step of the first epoch.
func Shard(ctx context.Context, prep *Prepared, plan *balancer.Plan, st *Store, o ShardOptions, progress func(done, total int)) (ShardSummary, error) {
	return ShardFrom(ctx, prep, plan, st, o, nil, progress)
}

// StepSource builds the rows of a plan's steps and emits them in the plan's
// step order, exactly as Preprocessor.Run does: every rank's micro-batches,
// each row as Preprocessor.Row builds it (a sample that fails to decode kept
// with weight 0).
type StepSource func(ctx context.Context, plan *balancer.Plan, emit func(StepBatch) error) error

// ShardFrom is Shard with every row written built by src (nil: a
// Preprocessor of prep, in this process), for example by remote workers: the
// first epoch's steps, then extra.arrow's records as a plan of one rank and
// one micro-batch per record.
// The files written depend only on the rows, so a src that keeps the
// StepSource contract writes files identical to Shard's.
func ShardFrom(ctx context.Context, prep *Prepared, plan *balancer.Plan, st *Store, o ShardOptions, src StepSource, progress func(done, total int)) (ShardSummary, error) {
	var sum ShardSummary
	if err := o.Validate(prep.Config.Image.DType); err != nil {
		return sum, err
	}
	if err := checkAugmentEpochs(prep.Config.Image, o.Epochs); err != nil {
		return sum, err
	}
	epochs, stored, err := planEpochs(ctx, prep, plan, o.Epochs)
	if err != nil {
		return sum, err
	}
	w := &shardWriter{prep: prep, plan: plan, stored: stored, st: st, o: o, src: src, lay: newLayout(plan, o.PartSteps), mem: memory.NewGoAllocator()}
	w.meta = w.batchMeta()
	w.fingerprint = fingerprint(prep, plan, o)
	if err := w.start(ctx); err != nil {
		return sum, err
	}
	if err := w.writeParts(ctx, progress); err != nil {
		return sum, err
	}
	if err := w.writeExtra(ctx, epochs); err != nil {
		return sum, err
	}
	return w.finish(ctx, epochs)
}

// shardWriter is one Shard run; used from one goroutine.
type shardWriter struct {
	prep        *Prepared
	plan        *balancer.Plan
	stored      Features // the items the set stores (planEpochs): prep's, then later epochs' draws
	st          *Store
	o           ShardOptions
	src         StepSource // nil: a local Preprocessor
	lay         layout
	mem         memory.Allocator
	meta        proto.BatchMeta
	fingerprint string
	files       []ShardFile // by file number (layout.file); the extra file last
	failed      map[int32]bool
	reused      int
}

// batchMeta is the metadata of the run's batches: the job's
// (Prepared.BatchMeta) as job "shard", with the store's pixel dtype.
func (w *shardWriter) batchMeta() proto.BatchMeta {
	m := w.prep.BatchMeta("shard", w.plan.Config.Epoch, proto.ModalityAll, w.plan.Config.Pack)
	if w.o.Store == StoreJPEG {
		m.DType = proto.DTypeJPEG
	}
	return m
}

// start checks that st holds nothing of another run and records this run's fingerprint.
func (w *shardWriter) start(ctx context.Context) error {
	w.files = make([]ShardFile, w.lay.files()+1)
	w.failed = map[int32]bool{}
	b, err := w.st.ReadAll(ctx, runFile)
	switch {
	case errors.Is(err, ErrNotExist):
	case err != nil:
		return err
	default:
		var r shardRun
		if err := json.Unmarshal(b, &r); err != nil || r.Fingerprint != w.fingerprint {
			return fmt.Errorf("pipeline: %s holds another shard run (%s %.12s, this run %.12s): choose an empty output or remove it: %w",
				w.st.URL(), runFile, r.Fingerprint, w.fingerprint, ErrShardMismatch)
		}
	}
	return writeJSON(ctx, w.st, runFile, shardRun{Fingerprint: w.fingerprint})
}

// writeParts writes the parts of the first epoch that no verified progress record covers.
func (w *shardWriter) writeParts(ctx context.Context, progress func(done, total int)) error {
	var todo []balancer.Step
	done := 0
	for p := range w.lay.parts {
		rec, ok := w.verifiedPart(ctx, partRecordName(p))
		if ok {
			w.reuse(rec)
			done += w.lay.partLen(p)
			continue
		}
		todo = append(todo, w.plan.Steps[p*w.lay.partSteps:p*w.lay.partSteps+w.lay.partLen(p)]...)
	}
	if progress != nil && done > 0 {
		progress(done, len(w.plan.Steps))
	}
	if len(todo) == 0 {
		return nil
	}
	src := w.src
	if src == nil {
		pp, err := NewPreprocessor(w.prep)
		if err != nil {
			return err
		}
		src = pp.Run
	}
	sub := &balancer.Plan{Config: w.plan.Config, Steps: todo}
	pos := make(map[int]int, len(w.plan.Steps)) // step index → position in the first epoch
	for k, s := range w.plan.Steps {
		pos[s.Index] = k
	}
	var part *partWriter
	defer func() { part.abort() }()
	return src(ctx, sub, func(sb StepBatch) error {
		k, ok := pos[sb.Step]
		if !ok || (part != nil && w.lay.part(k) != part.p) {
			return fmt.Errorf("pipeline: step source emitted step %d out of the plan's order", sb.Step)
		}
		p := w.lay.part(k)
		if part == nil {
			var err error
			if part, err = w.openPart(ctx, p); err != nil {
				return err
			}
		}
		if err := w.writeStep(part, k, sb); err != nil {
			return err
		}
		if k == w.lay.partStart(p)+w.lay.partLen(p)-1 {
			if err := w.closePart(ctx, part); err != nil {
				return err
			}
			part = nil
		}
		done++
		if progress != nil {
			progress(done, len(w.plan.Steps))
		}
		return nil
	})
}

// writeStep encodes (JPEG store) and appends the micro-batches of one step, noting the
// samples that failed to decode (weight 0 where the plan says 1).
func (w *shardWriter) writeStep(part *partWriter, k int, sb StepBatch) error {
	if err := w.encodeRows(sb.Rows); err != nil {
		return err
	}
	step := w.plan.Steps[k]
	for r, mbs := range sb.Rows {
		for m, rows := range mbs {
			for i, row := range rows {
				if e := step.Ranks[r][m][i]; row.Weight == 0 && e.Weight > 0 {
					w.failed[e.Item] = true
					part.rec.Failed = append(part.rec.Failed, e.Item)
				}
			}
			meta := w.meta
			meta.DPRank, meta.Step, meta.MicroBatch = r, sb.Step, m
			if err := part.write(r, meta, rows); err != nil {
				return fmt.Errorf("pipeline: step %d rank %d micro-batch %d: %w", sb.Step, r, m, err)
			}
		}
	}
	return nil
}

// encodeRows re-encodes every row's uint8 tensor as JPEG, on the configured workers.
func (w *shardWriter) encodeRows(rows [][][]proto.Row) error {
	if w.o.Store != StoreJPEG {
		return nil
	}
	var all []*proto.Row
	for _, mbs := range rows {
		for _, mb := range mbs {
			for i := range mb {
				all = append(all, &mb[i])
			}
		}
	}
	return w.encode(all)
}

func (w *shardWriter) encode(all []*proto.Row) error {
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	n := w.prep.Config.workers()
	for g := range n {
		wg.Go(func() {
			for i := g; i < len(all); i += n {
				r := all[i]
				b, err := imgproc.EncodeJPEG(r.Pixels, int(r.PixelShape[1]), int(r.PixelShape[2]), w.o.JPEGQuality)
				if err != nil {
					errs[i] = fmt.Errorf("pipeline: sample %q: %w", r.ID, err)
					continue
				}
				r.Pixels = b
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// ipcOptions are the Arrow IPC writer options of the compression setting.
func (w *shardWriter) ipcOptions() []ipc.Option {
	opts := []ipc.Option{ipc.WithAllocator(w.mem)}
	switch w.o.Compression {
	case CompressZstd:
		opts = append(opts, ipc.WithZstd(), ipc.WithMinSpaceSavings(0.05))
	case CompressLZ4:
		opts = append(opts, ipc.WithLZ4(), ipc.WithMinSpaceSavings(0.05))
	}
	return opts
}

// reuse takes over a verified part record of an interrupted run.
func (w *shardWriter) reuse(rec partRecord) {
	for _, f := range rec.Files {
		w.files[f.number] = f.ShardFile
		w.reused++
	}
	for _, it := range rec.Failed {
		w.failed[it] = true
	}
	w.requarantine(rec.Failed)
}

// requarantine quarantines again, with their reasons, the samples that failed to decode
// in a part an interrupted run wrote: the quarantine file is rewritten by every run.
func (w *shardWriter) requarantine(items []int32) {
	pp, err := NewPreprocessor(w.prep)
	if err != nil {
		return
	}
	for _, it := range items {
		e := w.stored.Entry(int(it))
		reason, detail := ReasonImageCorrupt, "failed in the interrupted run, decodes now"
		if _, _, err := pp.process(context.Background(), w.prep.Config.Plan.Epoch, e); err != nil { // a few samples, at the start of a resumed run
			reason, detail = reasonOf(err), err.Error()
		}
		w.prep.Quarantine.Write(loader.Reject{ID: e.ID, Location: e.Location, Reason: reason, Detail: detail})
	}
}
