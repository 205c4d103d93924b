package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"slices"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
)

// ShardManifestVersion is the version of shard.json and the index files.
const ShardManifestVersion = 2

// ShardManifest is shard.json: what a shard set holds and how to read it.
type ShardManifest struct {
	Format      string     `json:"format"` // "mmfeed-shard"
	Version     int        `json:"version"`
	Fingerprint string     `json:"fingerprint"`
	DP          int        `json:"dp"`
	MicroBatch  int        `json:"micro_batches"`
	Store       string     `json:"store"`
	DType       string     `json:"dtype"` // pixel_values dtype in the data files (jpeg for the JPEG store)
	JPEGQuality int        `json:"jpeg_quality,omitempty"`
	Compression string     `json:"compression"`
	Shape       []int      `json:"shape"` // fixed C,H,W, or null for dynamic resolution
	Mean        [3]float32 `json:"mean"`
	Std         [3]float32 `json:"std"`
	PartSteps   int        `json:"part_steps"`
	// Augment is the augmentation the pixels carry (imgproc.Augment, its
	// seed included; absent without one): one epoch's crops, that of Epochs[0].
	Augment *imgproc.Augment `json:"augment,omitempty"`
	// Files are the data files; an index's file column is a position in this list.
	Files  []ShardFile      `json:"files"`
	Epochs []EpochIndexInfo `json:"epochs"`
}

// ShardFile is one data file of a shard set.
type ShardFile struct {
	Path      string `json:"path"`
	Rank      int    `json:"rank"` // -1 for the extra file
	Part      int    `json:"part"`
	FirstStep int    `json:"first_step"`
	Steps     int    `json:"steps"`
	Records   int    `json:"records"`
	Rows      int    `json:"rows"`
	Bytes     int64  `json:"bytes"`
	SHA256    string `json:"sha256"`
}

// EpochIndexInfo describes one epoch's plan index.
type EpochIndexInfo struct {
	Epoch    int    `json:"epoch"`
	Path     string `json:"path"`
	Steps    int    `json:"steps"`
	Samples  int    `json:"samples"` // rows with weight > 0
	Rows     int    `json:"rows"`    // padding copies and failed samples included
	Dropped  int    `json:"dropped"`
	Rejected int    `json:"rejected"`
	PlanHash string `json:"plan_hash"`
}

// IndexFile is the plan index file name of an epoch.
func IndexFile(epoch int) string { return fmt.Sprintf("epoch-%05d.index.arrow", epoch) }

// IndexSchema is the schema of an index file: one record batch per dp rank, rows in
// (step, micro-batch, position) order; file/record/row locate the sample's row in the
// data files.
var IndexSchema = arrow.NewSchema([]arrow.Field{
	{Name: "id", Type: arrow.BinaryTypes.String},
	{Name: "step", Type: arrow.PrimitiveTypes.Int32},
	{Name: "micro_batch", Type: arrow.PrimitiveTypes.Int32},
	{Name: "file", Type: arrow.PrimitiveTypes.Int32},
	{Name: "record", Type: arrow.PrimitiveTypes.Int32},
	{Name: "row", Type: arrow.PrimitiveTypes.Int32},
	{Name: "weight", Type: arrow.PrimitiveTypes.Float32},
	{Name: "cost", Type: arrow.PrimitiveTypes.Float64},
}, nil)

// epochPlan is one epoch's plan over its own draws, each mapped to a stored
// item.
type epochPlan struct {
	plan   *balancer.Plan
	toItem []int32 // plan item → stored item (shardWriter.stored)
}

// planEpochs plans epochs first..first+n-1. Each later epoch is the one
// Dataset.Epoch orders for (seed, e), exactly what serve and Prepare give
// for that epoch (a permutation, or a mixture's draws), planned with the
// first epoch's config: one epoch-order path, no image header read again.
// stored is the items the set stores: the first epoch's features, then the
// draws later epochs plan that the first epoch does not hold (a mixture
// draws other samples and repetitions each epoch; a plain input's epochs
// hold the same samples, so nothing is added). A draw is the same stored
// item in every epoch when its index position and repeat are (drawKey).
func planEpochs(ctx context.Context, prep *Prepared, first *balancer.Plan, n int) (epochs []epochPlan, stored Features, err error) {
	f := prep.Features
	stored = f
	stored.Order, stored.Items = slices.Clip(f.Order), slices.Clip(f.Items) // appends never write into prep's
	stored.Sizes, stored.formats, stored.repeats = slices.Clip(f.Sizes), f.formats.clone(), slices.Clip(f.repeats)
	ident := make([]int32, len(f.Items))
	for i := range ident {
		ident[i] = int32(i)
	}
	epochs = []epochPlan{{plan: first, toItem: ident}}
	if n == 1 {
		return epochs, stored, nil
	}
	if prep.ds == nil {
		return nil, stored, fmt.Errorf("pipeline: plan %d epochs: the prepared epoch has no dataset", n)
	}
	at := make(map[uint64]int32, f.Len())
	for i := range f.Len() {
		if k := drawKey(&f, i); !hasItem(at, k) {
			at[k] = int32(i)
		}
	}
	for e := first.Config.Epoch + 1; e < first.Config.Epoch+n; e++ {
		c := first.Config
		c.Epoch = e
		pe, err := prep.ds.Epoch(ctx, c, nil) // its rejects are the first epoch's samples, quarantined there
		if err != nil {
			return nil, stored, fmt.Errorf("pipeline: order epoch %d: %w", e, err)
		}
		ep := epochPlan{toItem: make([]int32, pe.Features.Len())}
		for i := range pe.Features.Len() {
			k := drawKey(&pe.Features, i)
			j, ok := at[k]
			if !ok {
				j = int32(stored.Len())
				appendDraw(&stored, &pe.Features, i)
				at[k] = j
			}
			ep.toItem[i] = j
		}
		if ep.plan, err = balancer.Build(pe.Features.Items, c); err != nil {
			return nil, stored, fmt.Errorf("pipeline: plan epoch %d: %w", e, err)
		}
		epochs = append(epochs, ep)
	}
	stored.formats.done()
	return epochs, stored, nil
}

func hasItem(m map[uint64]int32, k uint64) bool { _, ok := m[k]; return ok }

// drawKey is item i's sample and draw: its position in the dataset's index and its repeat.
// Every epoch of one dataset indexes the same entries, so equal keys are the same draw
// (the same location and draw id) without materialising the entry, which over a packed
// index would re-read its record.
func drawKey(f *Features, i int) uint64 {
	return uint64(uint32(f.Order[i]))<<32 | uint64(uint32(f.Repeat(i)))
}

// appendDraw appends item i of src (features of the same index as dst) to dst.
func appendDraw(dst, src *Features, i int) {
	if rep := src.Repeat(i); rep > 0 && dst.repeats == nil {
		dst.repeats = make([]int32, dst.Len())
	}
	if dst.repeats != nil {
		dst.repeats = append(dst.repeats, int32(src.Repeat(i)))
	}
	dst.Order = append(dst.Order, src.Order[i])
	dst.Items = append(dst.Items, src.Items[i])
	dst.Sizes = append(dst.Sizes, src.Sizes[i])
	dst.formats.append(src.Format(i))
}

// rowLoc is where a sample's row lives in the data files.
type rowLoc struct{ file, record, row int32 }

// locations maps first-epoch items to their stored row: the first real row, else the
// first padding copy.
func (w *shardWriter) locations() map[int32]rowLoc {
	loc := make(map[int32]rowLoc, len(w.stored.Items))
	real := make(map[int32]bool, len(w.stored.Items))
	per := w.o.recordRows()
	next := make([]int, w.lay.files()) // the next record of each data file
	for k, s := range w.plan.Steps {
		p := w.lay.part(k)
		for r, mbs := range s.Ranks {
			f := w.lay.file(p, r)
			for _, mb := range mbs {
				for i, e := range mb {
					if real[e.Item] || (e.Weight == 0 && hasKey(loc, e.Item)) {
						continue
					}
					loc[e.Item] = rowLoc{int32(f), int32(next[f] + i/per), int32(i % per)}
					real[e.Item] = e.Weight > 0
				}
				next[f] += recordsOf(len(mb), per)
			}
		}
	}
	return loc
}

func hasKey(m map[int32]rowLoc, k int32) bool { _, ok := m[k]; return ok }

// extraItems lists, in first-use order, the items later epochs plan that the first
// epoch's files do not hold.
func extraItems(epochs []epochPlan, loc map[int32]rowLoc) []int32 {
	seen := map[int32]bool{}
	var out []int32
	for _, ep := range epochs[1:] {
		for _, s := range ep.plan.Steps {
			for _, mbs := range s.Ranks {
				for _, mb := range mbs {
					for _, e := range mb {
						it := ep.toItem[e.Item]
						if _, ok := loc[it]; !ok && !seen[it] {
							seen[it] = true
							out = append(out, it)
						}
					}
				}
			}
		}
	}
	return out
}

// extraRecordRows is the number of samples per micro-batch written to extra.arrow
// (stored as records of ShardOptions.RecordRows rows).
const extraRecordRows = 64

// writeExtra preprocesses the samples only later epochs use into extra.arrow.
// Their items index w.stored, which may hold more than prep's features (a
// mixture's later draws): while it runs, prep.Features is w.stored, so that
// the step source (a Preprocessor, or the workers', which read the
// Prepared's features) builds their rows; prep's own are back when it
// returns (the report plans them).
func (w *shardWriter) writeExtra(ctx context.Context, epochs []epochPlan) error {
	items := extraItems(epochs, w.locations())
	if len(items) == 0 {
		return nil
	}
	if w.stored.Len() > w.prep.Features.Len() {
		own := w.prep.Features
		w.prep.Features = w.stored
		defer func() { w.prep.Features = own }()
	}
	if rec, ok := w.verifiedPart(ctx, extraRecordName); ok {
		w.reuse(rec)
		return nil
	}
	steps := make([]balancer.Step, 0, (len(items)+extraRecordRows-1)/extraRecordRows)
	for i := 0; i < len(items); i += extraRecordRows {
		mb := make(balancer.MicroBatch, 0, extraRecordRows)
		for _, it := range items[i:min(i+extraRecordRows, len(items))] {
			mb = append(mb, balancer.Entry{Item: it, Weight: 1})
		}
		steps = append(steps, balancer.Step{Index: len(steps), Ranks: [][]balancer.MicroBatch{{mb}}})
	}
	src := w.src
	if src == nil {
		pp, err := NewPreprocessor(w.prep)
		if err != nil {
			return err
		}
		src = pp.Run
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pw := &partWriter{p: -1, rows: w.o.recordRows(), alloc: w.mem, cancel: cancel}
	defer pw.abort()
	if err := pw.add(pctx, w, w.meta, ShardFile{Path: extraFile, Rank: -1, Part: -1}); err != nil {
		return err
	}
	err := src(ctx, &balancer.Plan{Config: w.plan.Config, Steps: steps}, func(sb StepBatch) error {
		rows := sb.Rows[0][0]
		if err := w.encodeRows(sb.Rows); err != nil {
			return err
		}
		for i, row := range rows {
			if it := steps[sb.Step].Ranks[0][0][i].Item; row.Weight == 0 {
				w.failed[it] = true
				pw.rec.Failed = append(pw.rec.Failed, it)
			}
		}
		return pw.write(0, w.meta, rows)
	})
	if err != nil {
		return err
	}
	return w.closePart(ctx, pw)
}

// finish writes the epoch indexes and the manifest.
func (w *shardWriter) finish(ctx context.Context, epochs []epochPlan) (ShardSummary, error) {
	sum := ShardSummary{Reused: w.reused, Failed: w.failedPlanned()}
	loc := w.locations()
	per := w.o.recordRows()
	for i, it := range extraItems(epochs, loc) {
		j := i % extraRecordRows // extra.arrow holds micro-batches of extraRecordRows rows
		loc[it] = rowLoc{int32(w.lay.extraNumber()), int32(i/extraRecordRows*recordsOf(extraRecordRows, per) + j/per), int32(j % per)}
	}
	files := w.files
	if files[len(files)-1].Path == "" {
		files = files[:len(files)-1]
	}
	for _, f := range files {
		sum.Files = append(sum.Files, f.Path)
		sum.Batches += f.Records
		sum.Rows += f.Rows
		sum.Bytes += f.Bytes
	}
	for _, ep := range epochs {
		info, n, err := w.writeIndex(ctx, ep, loc)
		if err != nil {
			return sum, err
		}
		sum.Bytes += n
		sum.Epochs = append(sum.Epochs, info)
	}
	m := ShardManifest{Format: "mmfeed-shard", Version: ShardManifestVersion, Fingerprint: w.fingerprint,
		DP: w.lay.dp, MicroBatch: w.lay.mbs, Store: w.o.Store, DType: w.meta.DType, Compression: w.o.Compression,
		Shape: w.meta.Shape, Mean: w.meta.Mean, Std: w.meta.Std, PartSteps: w.o.PartSteps, Files: files, Epochs: sum.Epochs}
	if w.o.Store == StoreJPEG {
		m.JPEGQuality = w.o.JPEGQuality
	}
	if a := w.prep.Config.Image.Augment; a.Enabled() {
		m.Augment = &a
	}
	return sum, writeJSON(ctx, w.st, manifestFile, m)
}

// failedPlanned lists, ascending, the failed samples that the first epoch plans with
// weight > 0 (not those of extra.arrow only, which it drops at the tail).
func (w *shardWriter) failedPlanned() []int32 {
	var out []int32
	for _, st := range w.plan.Steps {
		for _, mbs := range st.Ranks {
			for _, mb := range mbs {
				for _, e := range mb {
					if e.Weight > 0 && w.failed[e.Item] {
						out = append(out, e.Item)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// writeIndex writes one epoch's index: a record batch per dp rank.
func (w *shardWriter) writeIndex(ctx context.Context, ep epochPlan, loc map[int32]rowLoc) (EpochIndexInfo, int64, error) {
	pc := ep.plan.Config
	info := EpochIndexInfo{Epoch: pc.Epoch, Path: IndexFile(pc.Epoch), Steps: len(ep.plan.Steps),
		Dropped: len(ep.plan.Dropped), Rejected: len(ep.plan.Rejected), PlanHash: ep.plan.Hash()}
	var size int64
	err := w.st.WriteFile(ctx, info.Path, func(out io.Writer) error {
		fw, err := ipc.NewFileWriter(out, append(w.ipcOptions(), ipc.WithSchema(IndexSchema))...)
		if err != nil {
			return err
		}
		for r := range pc.DP {
			rec, err := w.indexRecord(ep, r, loc, &info)
			if err != nil {
				fw.Close()
				return err
			}
			err = fw.Write(rec)
			rec.Release()
			if err != nil {
				fw.Close()
				return err
			}
		}
		if err := fw.Close(); err != nil {
			return err
		}
		size = out.(*StoreWriter).Size()
		return nil
	})
	return info, size, err
}

func (w *shardWriter) indexRecord(ep epochPlan, rank int, loc map[int32]rowLoc, info *EpochIndexInfo) (arrow.RecordBatch, error) {
	b := array.NewRecordBuilder(w.mem, IndexSchema)
	defer b.Release()
	pc := ep.plan.Config
	items := ep.plan.Items()
	for _, s := range ep.plan.Steps {
		for m, mb := range s.Ranks[rank] {
			for _, e := range mb {
				it := ep.toItem[e.Item]
				l, ok := loc[it]
				if !ok {
					return nil, fmt.Errorf("pipeline: epoch %d: item %d has no stored row", pc.Epoch, it)
				}
				weight := e.Weight
				if w.failed[it] {
					weight = 0
				}
				if weight > 0 {
					info.Samples++
				}
				info.Rows++
				b.Field(0).(*array.StringBuilder).Append(w.stored.Entry(int(it)).ID)
				b.Field(1).(*array.Int32Builder).Append(int32(s.Index))
				b.Field(2).(*array.Int32Builder).Append(int32(m))
				b.Field(3).(*array.Int32Builder).Append(l.file)
				b.Field(4).(*array.Int32Builder).Append(l.record)
				b.Field(5).(*array.Int32Builder).Append(l.row)
				b.Field(6).(*array.Float32Builder).Append(weight)
				b.Field(7).(*array.Float64Builder).Append(pc.Placement.StepCost(pc.Model.Cost(items[e.Item])))
			}
		}
	}
	return b.NewRecordBatch(), nil
}

// fingerprint names a shard run: the first epoch's plan, the image and tokenizer
// settings, the dataset size, the options and the kept columns.
func fingerprint(prep *Prepared, plan *balancer.Plan, o ShardOptions) string {
	h := sha256.New()
	c := prep.Config
	o.RecordRows = o.recordRows() // 0 and 1 write the same files
	json.NewEncoder(h).Encode(struct {
		Plan      string
		Seen      int64
		Image     any
		Tokenizer any
		Options   ShardOptions
	}{plan.Hash(), prep.Seen(), c.Image, c.Tokenizer, o})
	if k := KeepColumns(prep.Index); k != nil { // kept columns change the files' schema
		json.NewEncoder(h).Encode(k)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func writeJSON(ctx context.Context, st *Store, name string, v any) error {
	return st.WriteFile(ctx, name, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	})
}
