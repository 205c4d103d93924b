package pipeline

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/proto"
)

// Shard store modes (ShardOptions.Store).
const (
	StoreTensor = "tensor" // the preprocessed tensor in the image config's dtype
	StoreJPEG   = "jpeg"   // the resized, cropped image re-encoded as JPEG (lossy)
)

// Compression codecs of the Arrow IPC buffers (ShardOptions.Compression).
const (
	CompressNone = "none"
	CompressZstd = "zstd"
	CompressLZ4  = "lz4"
)

// ShardOptions say how Shard stores a dataset.
type ShardOptions struct {
	// Store is StoreTensor (default) or StoreJPEG. JPEG needs the image dtype uint8.
	Store string
	// JPEGQuality is the JPEG quality, 1..100 (default 95).
	JPEGQuality int
	// Compression is CompressNone, CompressZstd or CompressLZ4 (Arrow IPC buffer compression).
	Compression string
	// Epochs is the number of epochs planned, from the config's Plan.Epoch on (default 1).
	// Samples are written once; each epoch adds a small index.
	Epochs int
	// PartSteps splits the rank files every PartSteps steps of the first epoch, so that a
	// crashed run redoes at most one part (0: one file per rank).
	PartSteps int
	// RecordRows is the most rows one record batch of a data file holds (0: 1). A
	// micro-batch is stored as consecutive records of up to RecordRows rows, so a later
	// epoch, which gathers rows through its index, decompresses only the records of the
	// rows it reads: with one row per record no row is decompressed for nothing. Larger
	// values trade that for fewer, better-compressed records.
	RecordRows int
}

// recordRows is RecordRows with its default.
func (o ShardOptions) recordRows() int { return max(o.RecordRows, 1) }

// DefaultShardOptions: tensor, zstd, one epoch, one file per rank.
func DefaultShardOptions() ShardOptions {
	return ShardOptions{Store: StoreTensor, JPEGQuality: 95, Compression: CompressZstd, Epochs: 1}
}

// Validate checks the options against the image config they will store.
func (o ShardOptions) Validate(img string) error {
	switch o.Store {
	case StoreTensor:
		if proto.IsJPEGDType(img) {
			return fmt.Errorf("pipeline: --dtype %s is a wire mode; shards store JPEG with --store jpeg", img)
		}
	case StoreJPEG:
		if img != proto.DTypeUint8 {
			return fmt.Errorf("pipeline: --store jpeg needs --dtype uint8 (JPEG keeps raw pixels), have %s", img)
		}
	default:
		return fmt.Errorf("pipeline: store %q (want tensor|jpeg)", o.Store)
	}
	if o.JPEGQuality < 1 || o.JPEGQuality > 100 {
		return fmt.Errorf("pipeline: jpeg quality %d not in [1,100]", o.JPEGQuality)
	}
	switch o.Compression {
	case CompressNone, CompressZstd, CompressLZ4:
	default:
		return fmt.Errorf("pipeline: compression %q (want none|zstd|lz4)", o.Compression)
	}
	if o.Epochs < 1 || o.Epochs > 1<<16 {
		return fmt.Errorf("pipeline: epochs %d not in [1,65536]", o.Epochs)
	}
	if o.RecordRows < 0 {
		return fmt.Errorf("pipeline: record rows %d < 0", o.RecordRows)
	}
	if o.PartSteps < 0 {
		return fmt.Errorf("pipeline: part steps %d < 0", o.PartSteps)
	}
	return nil
}

// ShardSummary says what Shard wrote.
type ShardSummary struct {
	Files   []string // data files (rank files, then the extra file), in manifest order, relative to the store
	Batches int      // record batches over the data files
	Rows    int      // rows over the data files, padding copies included
	Bytes   int64    // bytes over the data files and indexes
	// Reused counts the data files of a previous, interrupted run that were verified
	// and kept.
	Reused int
	// Epochs are the per-epoch plans written as indexes.
	Epochs []EpochIndexInfo
	// Failed lists the samples (indices into Prepared.Features) that the first epoch
	// plans with weight 1 and the data files store at weight 0: they failed to read
	// or decode and are quarantined. Ascending.
	Failed []int32
}

// Planned is how many samples the first epoch stores with weight 1: the plan's real
// entries less Failed, so that planned + quarantined + dropped = seen.
func (s ShardSummary) Planned(plan *balancer.Plan) int {
	n := 0
	for _, st := range plan.Steps {
		for _, mbs := range st.Ranks {
			for _, mb := range mbs {
				for _, e := range mb {
					if e.Weight > 0 {
						n++
					}
				}
			}
		}
	}
	return n - len(s.Failed)
}

// StoredPlan returns plan with the weights the data files store: a copy in which
// every entry of a sample in failed has weight 0 (plan is not changed). plan.jsonl is
// written from it, so it never says weight 1 for a row the files hold at weight 0.
func StoredPlan(plan *balancer.Plan, failed []int32) *balancer.Plan {
	if len(failed) == 0 {
		return plan
	}
	bad := make(map[int32]bool, len(failed))
	for _, it := range failed {
		bad[it] = true
	}
	q := *plan
	q.Steps = make([]balancer.Step, len(plan.Steps))
	for k, st := range plan.Steps {
		ranks := make([][]balancer.MicroBatch, len(st.Ranks))
		for r, mbs := range st.Ranks {
			ranks[r] = make([]balancer.MicroBatch, len(mbs))
			for m, mb := range mbs {
				ranks[r][m] = slices.Clone(mb)
				for i, e := range mb {
					if bad[e.Item] {
						ranks[r][m][i].Weight = 0
					}
				}
			}
		}
		q.Steps[k] = balancer.Step{Index: st.Index, Ranks: ranks}
	}
	return &q
}

// RankFile is the Arrow IPC file name of a dp rank when the set has one part.
func RankFile(rank int) string { return fmt.Sprintf("rank-%05d.arrow", rank) }

// PartRankFile is the file name of one part of a dp rank's records.
func PartRankFile(part, rank int) string { return fmt.Sprintf("part-%05d-rank-%05d.arrow", part, rank) }

// WriteShards writes the plan's epoch into the local folder dir with the default
// options, tensor store uncompressed: one rank-%05d.arrow per dp rank holding one record
// per micro-batch (the layout every reader of older sets knows), plus shard.json and the
// epoch index. Summary paths
// include dir.
func WriteShards(ctx context.Context, prep *Prepared, plan *balancer.Plan, dir string, progress func(done, total int)) (ShardSummary, error) {
	st, err := OpenStore(ctx, dir)
	if err != nil {
		return ShardSummary{}, err
	}
	defer st.Close()
	o := DefaultShardOptions()
	o.Compression = CompressNone
	o.RecordRows = 1 << 30 // one record per micro-batch, as older readers group them
	sum, err := Shard(ctx, prep, plan, st, o, progress)
	for i, f := range sum.Files {
		sum.Files[i] = filepath.Join(dir, f)
	}
	return sum, err
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
