package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/proto"
)

// ShardSummary says what WriteShards wrote.
type ShardSummary struct {
	Files   []string // rank files, in rank order
	Batches int      // record batches over all files (steps × dp × micro-batches)
	Rows    int      // rows over all files, padding copies included
	Bytes   int64    // bytes over all rank files
}

// RankFile is the Arrow IPC file name of a dp rank.
func RankFile(rank int) string { return fmt.Sprintf("rank-%05d.arrow", rank) }

// WriteShards preprocesses every planned step and writes one Arrow IPC file per dp rank
// into dir: one record batch per micro-batch, in step order (proto's batch schema,
// modality "all"). progress, when not nil, is called after each step.
func WriteShards(ctx context.Context, prep *Prepared, plan *balancer.Plan, dir string, progress func(done, total int)) (ShardSummary, error) {
	var sum ShardSummary
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return sum, err
	}
	img := prep.Config.Image
	mean, std := img.MeanStd()
	meta := proto.BatchMeta{Job: "shard", Epoch: plan.Config.Epoch, Modality: proto.ModalityAll, DType: img.DType, Mean: mean, Std: std,
		Pack: plan.Config.Pack}
	if img.Policy != "dynamic" {
		meta.Shape = []int{3, img.Size, img.Size}
	}
	files := make([]*os.File, plan.Config.DP)
	writers := make([]*ipc.FileWriter, plan.Config.DP)
	closeAll := func() error {
		var errs []error
		for r := range files {
			if writers[r] != nil {
				errs = append(errs, writers[r].Close())
			}
			if files[r] != nil {
				errs = append(errs, files[r].Close())
			}
		}
		return errors.Join(errs...)
	}
	mem := memory.NewGoAllocator()
	for r := range files {
		m := meta
		m.DPRank = r
		schema, err := proto.Schema(m)
		if err != nil {
			return sum, err
		}
		path := filepath.Join(dir, RankFile(r))
		if files[r], err = os.Create(path); err != nil {
			closeAll()
			return sum, err
		}
		if writers[r], err = ipc.NewFileWriter(files[r], ipc.WithSchema(schema), ipc.WithAllocator(mem)); err != nil {
			closeAll()
			return sum, err
		}
		sum.Files = append(sum.Files, path)
	}
	pp, err := NewPreprocessor(prep)
	if err != nil {
		closeAll()
		return sum, err
	}
	done := 0
	err = pp.Run(ctx, plan, func(sb StepBatch) error {
		for r, mbs := range sb.Rows {
			for mbi, rows := range mbs {
				m := meta
				m.DPRank, m.Step, m.MicroBatch = r, sb.Step, mbi
				if err := writeBatch(mem, writers[r], m, rows); err != nil {
					return fmt.Errorf("pipeline: step %d rank %d micro-batch %d: %w", sb.Step, r, mbi, err)
				}
				sum.Batches++
				sum.Rows += len(rows)
			}
		}
		done++
		if progress != nil {
			progress(done, len(plan.Steps))
		}
		return nil
	})
	if cerr := closeAll(); err == nil {
		err = cerr
	}
	for _, f := range sum.Files {
		if st, serr := os.Stat(f); serr == nil {
			sum.Bytes += st.Size()
		}
	}
	return sum, err
}

func writeBatch(mem memory.Allocator, w *ipc.FileWriter, meta proto.BatchMeta, rows []proto.Row) error {
	rec, err := proto.BuildRecord(mem, meta, rows)
	if err != nil {
		return err
	}
	defer rec.Release()
	return w.Write(rec)
}

// WriteFile creates path and fills it with write.
func WriteFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
