package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/proto"
)

// ErrShardMismatch: the output holds files of a different shard run.
var ErrShardMismatch = errors.New("pipeline: output holds another shard run")

const (
	runFile      = "progress/run.json"
	manifestFile = "shard.json"
	extraFile    = "extra.arrow"
)

func partRecordName(p int) string { return fmt.Sprintf("progress/part-%05d.json", p) }

const extraRecordName = "progress/extra.json"

// shardRun identifies the run that owns an output.
type shardRun struct {
	Fingerprint string `json:"fingerprint"`
}

// partRecord is written when every file of a part is committed.
type partRecord struct {
	Files  []numberedFile `json:"files"`
	Failed []int32        `json:"failed,omitempty"` // items (first-epoch features) that failed to decode
}

type numberedFile struct {
	ShardFile
	number int
}

func (n numberedFile) MarshalJSON() ([]byte, error) {
	type plain struct {
		ShardFile
		Number int `json:"number"`
	}
	return json.Marshal(plain{n.ShardFile, n.number})
}

func (n *numberedFile) UnmarshalJSON(b []byte) error {
	var p struct {
		ShardFile
		Number int `json:"number"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	n.ShardFile, n.number = p.ShardFile, p.Number
	return nil
}

// layout maps the first epoch's steps to parts and files: file number part*DP + rank;
// the extra file comes after the last part.
type layout struct {
	steps, dp, mbs, partSteps, parts int
}

func newLayout(plan *balancer.Plan, partSteps int) layout {
	n := len(plan.Steps)
	if partSteps <= 0 || partSteps > n {
		partSteps = max(n, 1)
	}
	return layout{steps: n, dp: plan.Config.DP, mbs: plan.Config.MicroBatches, partSteps: partSteps, parts: (n + partSteps - 1) / partSteps}
}

func (l layout) files() int           { return l.parts * l.dp }
func (l layout) part(k int) int       { return k / l.partSteps }
func (l layout) partStart(p int) int  { return p * l.partSteps }
func (l layout) partLen(p int) int    { return min(l.partSteps, l.steps-p*l.partSteps) }
func (l layout) file(p, rank int) int { return p*l.dp + rank }
func (l layout) extraNumber() int     { return l.files() }
func (l layout) name(p, rank int) string {
	if l.parts == 1 {
		return RankFile(rank)
	}
	return PartRankFile(p, rank)
}

// verifiedPart reads a progress record and checks every file it lists.
func (w *shardWriter) verifiedPart(ctx context.Context, name string) (partRecord, bool) {
	var rec partRecord
	b, err := w.st.ReadAll(ctx, name)
	if err != nil || json.Unmarshal(b, &rec) != nil || len(rec.Files) == 0 {
		return rec, false
	}
	for _, f := range rec.Files {
		if f.number < 0 || f.number >= len(w.files) {
			return rec, false
		}
		size, sum, err := w.st.Hash(ctx, f.Path)
		if err != nil || size != f.Bytes || sum != f.SHA256 {
			return rec, false
		}
	}
	return rec, true
}

// partWriter holds the open files of one part, one per rank.
type partWriter struct {
	p      int
	rows   int // the most rows per record (ShardOptions.RecordRows)
	alloc  memory.Allocator
	cancel context.CancelFunc
	out    []*StoreWriter
	ipc    []*ipc.FileWriter
	files  []ShardFile
	rec    partRecord
}

func (w *shardWriter) openPart(ctx context.Context, p int) (*partWriter, error) {
	ctx, cancel := context.WithCancel(ctx)
	pw := &partWriter{p: p, rows: w.o.recordRows(), alloc: w.mem, cancel: cancel}
	for r := range w.lay.dp {
		m := w.meta
		m.DPRank = r
		f := ShardFile{Path: w.lay.name(p, r), Rank: r, Part: p, FirstStep: w.plan.Steps[w.lay.partStart(p)].Index, Steps: w.lay.partLen(p)}
		if err := pw.add(ctx, w, m, f); err != nil {
			pw.abort()
			return nil, err
		}
	}
	return pw, nil
}

func (pw *partWriter) add(ctx context.Context, w *shardWriter, meta proto.BatchMeta, f ShardFile) error {
	schema, err := proto.Schema(meta)
	if err != nil {
		return err
	}
	out, err := w.st.Create(ctx, f.Path)
	if err != nil {
		return err
	}
	fw, err := ipc.NewFileWriter(out, append(w.ipcOptions(), ipc.WithSchema(schema))...)
	if err != nil {
		return fmt.Errorf("pipeline: %s: %w", f.Path, err)
	}
	pw.out, pw.ipc, pw.files = append(pw.out, out), append(pw.ipc, fw), append(pw.files, f)
	return nil
}

// write appends one micro-batch to file i of the part, as records of up to pw.rows rows.
func (pw *partWriter) write(i int, meta proto.BatchMeta, rows []proto.Row) error {
	for lo := 0; lo < len(rows); lo += pw.rows {
		chunk := rows[lo:min(lo+pw.rows, len(rows))]
		rec, err := proto.BuildRecord(pw.alloc, meta, chunk)
		if err != nil {
			return err
		}
		err = pw.ipc[i].Write(rec)
		rec.Release()
		if err != nil {
			return err
		}
		pw.files[i].Records++
		pw.files[i].Rows += len(chunk)
	}
	return nil
}

// recordsOf is how many records a micro-batch of n rows is stored as.
func recordsOf(n, perRecord int) int { return (n + perRecord - 1) / perRecord }

// abort discards the part's uncommitted files.
func (pw *partWriter) abort() {
	if pw == nil || pw.cancel == nil {
		return
	}
	pw.cancel()
	for i := range pw.out {
		pw.ipc[i].Close()
		pw.out[i].Close()
	}
	pw.cancel = nil
}

// closePart commits the part's files and records them in progress/.
func (w *shardWriter) closePart(ctx context.Context, pw *partWriter) error {
	if err := pw.commit(); err != nil {
		return err
	}
	pw.rec.Files = make([]numberedFile, len(pw.files))
	for r, f := range pw.files {
		n := w.lay.file(pw.p, r)
		if f.Rank < 0 {
			n = w.lay.extraNumber()
		}
		pw.rec.Files[r] = numberedFile{f, n}
		w.files[n] = f
	}
	return writeJSON(ctx, w.st, pw.recordName(), pw.rec)
}

func (pw *partWriter) recordName() string {
	if pw.p < 0 {
		return extraRecordName
	}
	return partRecordName(pw.p)
}

// commit closes every file; the first error discards the rest.
func (pw *partWriter) commit() error {
	for i := range pw.out {
		if err := pw.ipc[i].Close(); err != nil {
			pw.abort()
			return fmt.Errorf("pipeline: %s: %w", pw.files[i].Path, err)
		}
		if err := pw.out[i].Close(); err != nil {
			pw.abort()
			return fmt.Errorf("pipeline: %s: %w", pw.files[i].Path, err)
		}
		pw.files[i].Bytes, pw.files[i].SHA256 = pw.out[i].Size(), pw.out[i].SHA256()
	}
	pw.cancel()
	pw.cancel = nil
	return nil
}
