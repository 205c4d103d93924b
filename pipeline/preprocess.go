package pipeline

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/semaphore"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/proto"
)

// StepBatch is one planned step, preprocessed: Rows[rank][microBatch] in plan order.
type StepBatch struct {
	Step int
	Rows [][][]proto.Row
}

// Preprocessor turns planned entries into rows: token ids and image tensors.
type Preprocessor struct {
	prep *Prepared
	proc *imgproc.Processor
	// read re-reads an entry's image bytes (the index, or a test's flaky
	// stand-in); a transient failure is retried (readWithRetry).
	read func(context.Context, loader.Entry) ([]byte, error)
	// pixels holds Config.MaxPixelsInFlight; each decode takes its
	// header's pixel count (capped at the budget) for its duration.
	pixels       *semaphore.Weighted
	budget       int64
	inFlight     atomic.Int64 // pixels being decoded now
	peakInFlight atomic.Int64
	// jpegSource and jpegFallback count the jpeg-source images (jpegwire.go).
	jpegSource, jpegFallback atomic.Int64
}

// NewPreprocessor builds the image processor of the prepared config.
// A Prepared of a Dataset shares the dataset's image processor.
func NewPreprocessor(p *Prepared) (*Preprocessor, error) {
	if p.ds != nil {
		return newPreprocessor(p, p.ds.proc), nil
	}
	proc, err := imgproc.NewProcessor(p.Config.Image)
	if err != nil {
		return nil, err
	}
	return newPreprocessor(p, proc), nil
}

func newPreprocessor(p *Prepared, proc *imgproc.Processor) *Preprocessor {
	budget := p.Config.pixelsInFlight()
	return &Preprocessor{prep: p, proc: proc, read: p.Index.ReadImageContext,
		pixels: semaphore.NewWeighted(budget), budget: budget}
}

// Run preprocesses the plan's steps in order on the configured workers and calls emit
// for each step, in step order, from one goroutine. Up to two steps are prepared ahead
// of the one being emitted. A sample that fails to decode here (its header was fine) is
// quarantined and its row kept with weight 0 and zero pixels, so every rank still gets
// the planned micro-batches.
func (pp *Preprocessor) Run(ctx context.Context, plan *balancer.Plan, emit func(StepBatch) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type task struct {
		rows *proto.Row
		e    balancer.Entry
		done *sync.WaitGroup
	}
	tasks := make(chan task, 256)
	var workers sync.WaitGroup
	for range pp.prep.Config.workers() {
		workers.Go(func() {
			for t := range tasks {
				*t.rows = pp.row(ctx, plan, t.e)
				t.done.Done()
			}
		})
	}
	producer := make(chan struct{})
	defer func() { // stop the producer before closing its channel: a send on a closed channel panics
		cancel()
		<-producer
		close(tasks)
		workers.Wait()
	}()

	type pending struct {
		sb   StepBatch
		done *sync.WaitGroup
	}
	ready := make(chan pending, 2)
	go func() {
		defer close(producer)
		defer close(ready)
		for _, s := range plan.Steps {
			sb := StepBatch{Step: s.Index, Rows: make([][][]proto.Row, len(s.Ranks))}
			done := &sync.WaitGroup{}
			for r, mbs := range s.Ranks {
				sb.Rows[r] = make([][]proto.Row, len(mbs))
				for m, mb := range mbs {
					sb.Rows[r][m] = make([]proto.Row, len(mb))
					for i, e := range mb {
						done.Add(1)
						select {
						case tasks <- task{&sb.Rows[r][m][i], e, done}:
						case <-ctx.Done():
							done.Done()
							return
						}
					}
				}
			}
			select {
			case ready <- pending{sb, done}:
			case <-ctx.Done():
				return
			}
		}
	}()
	for p := range ready {
		p.done.Wait()
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := emit(p.sb); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// row preprocesses one plan entry.
func (pp *Preprocessor) row(ctx context.Context, plan *balancer.Plan, e balancer.Entry) proto.Row {
	f := &pp.prep.Features
	return pp.Row(ctx, f.Entry(int(e.Item)), PlannedRow(f, plan, e))
}

// PlannedRow is entry e's row as plan has it, before preprocessing: the
// sample's id and token counts (f's), its step cost under the plan's model
// and placement, and its weight. The one builder of it for local and
// remote preprocessing (a worker's batch item carries these fields).
func PlannedRow(f *Features, plan *balancer.Plan, e balancer.Entry) proto.Row {
	it := f.Items[e.Item]
	cost := plan.Config.Placement.StepCost(plan.Config.Model.Cost(it))
	return proto.Row{ID: f.Entry(int(e.Item)).ID, TextTokens: int32(it.TextTokens), ImageTokens: int32(it.ImageTokens), Cost: cost, Weight: e.Weight}
}

// process tokenizes the caption and decodes, resizes and normalizes the image of ent.
// A transient read error is retried up to readAttempts times.
func (pp *Preprocessor) process(ctx context.Context, epoch int, ent loader.Entry) ([]int32, imgproc.Image, error) {
	ids, err := pp.prep.Tokenizer.Encode(ent.Text)
	if err != nil {
		return nil, imgproc.Image{}, err
	}
	data, err := readWithRetry(ctx, func() ([]byte, error) { return pp.read(ctx, ent) })
	if err != nil {
		return ids, imgproc.Image{}, fmt.Errorf("%w: %w", errUnreadable, err)
	}
	img, err := pp.decode(ctx, data, epoch, ent.ID)
	return ids, img, err
}

// decode runs the image processor once the pixels of data's header fit in
// the in-flight budget (a header that does not parse costs nothing: the
// processor rejects it without a pixel buffer), augmented for (epoch, id)
// when the config asks for it.
func (pp *Preprocessor) decode(ctx context.Context, data []byte, epoch int, id string) (imgproc.Image, error) {
	if h, err := imgproc.ReadHeader(data); err == nil {
		n := min(int64(h.Width)*int64(h.Height), pp.budget)
		if err := pp.pixels.Acquire(ctx, n); err != nil {
			return imgproc.Image{}, err
		}
		defer pp.pixels.Release(n)
		cur := pp.inFlight.Add(n)
		defer pp.inFlight.Add(-n)
		for peak := pp.peakInFlight.Load(); cur > peak && !pp.peakInFlight.CompareAndSwap(peak, cur); peak = pp.peakInFlight.Load() {
		}
	}
	if a := pp.proc.Config().Augment; a.Enabled() {
		return pp.proc.ProcessSample(nil, data, AugmentRand(a.Seed, epoch, id))
	}
	return pp.proc.Process(data)
}

// zeroRow keeps a failed sample's place with weight 0 and a zero tensor of the planned shape.
func (pp *Preprocessor) zeroRow(row proto.Row, ids []int32) proto.Row {
	c := pp.prep.Config.Image
	h, w := c.Size, c.Size
	if c.Policy == imgproc.PolicyDynamic { // one patch is the smallest valid image
		h, w = c.PatchSize, c.PatchSize
		row.ImageTokens = 1
	}
	row.Weight = 0
	row.InputIDs = ids
	if ids == nil {
		row.InputIDs = []int32{}
	}
	row.PixelShape = [3]int32{3, int32(h), int32(w)}
	row.Pixels = zeroPixels(c, h, w)
	return row
}
