package pipeline

import (
	"context"
	"fmt"
	"image"
	"math"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/tokenize"
)

// EntryFeatures is one index entry's features, or why it is quarantined.
type EntryFeatures struct {
	Item   balancer.Item  `json:"item"`
	Size   image.Point    `json:"size"`
	Format string         `json:"format,omitempty"`
	Reject *loader.Reject `json:"reject,omitempty"`
}

// FeatureFunc computes the features of every entry of ix, in the index's
// (source) order: Config.Features, for a job that computes them elsewhere
// (a planner's workers) or caches them.
type FeatureFunc func(ctx context.Context, ix *loader.Index) ([]EntryFeatures, error)

// FeaturesRange computes the features of ix.Entries(lo, hi) on the calling
// goroutine, counting tokens one chunk of captions at a time: what a
// feature work item does.
func FeaturesRange(ctx context.Context, ix *loader.Index, lo, hi int, tk *tokenize.Tokenizer, img imgproc.Config) ([]EntryFeatures, error) {
	if lo < 0 || hi > ix.Len() || lo > hi {
		return nil, fmt.Errorf("pipeline: feature range [%d, %d) of %d entries", lo, hi, ix.Len())
	}
	out := make([]EntryFeatures, 0, hi-lo)
	texts := make([]string, 0, featureChunk)
	for c := lo; c < hi; c += featureChunk {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		end := min(hi, c+featureChunk)
		chunk := ix.Entries(c, end)
		texts = texts[:0]
		for _, e := range chunk {
			texts = append(texts, e.Text)
		}
		counts, errs, err := tk.CountBatch(texts)
		for i := c; i < end; i++ {
			cerr := err
			if cerr == nil {
				cerr = errs[i-c]
			}
			out = append(out, featuresOf(ix, chunk[i-c], counts, i-c, cerr, img))
		}
	}
	return out, nil
}

// orderFeatures orders all (the features of ix's entries) as perm (an epoch's
// permutation of the index, or a mixture's draws with their repeats: nil
// for none), quarantining the rejects.
func orderFeatures(ix *loader.Index, all []EntryFeatures, perm []int, repeats []int32, q *loader.QuarantineWriter) (Features, error) {
	if len(all) != ix.Len() {
		return Features{}, fmt.Errorf("pipeline: features of %d entries for an index of %d", len(all), ix.Len())
	}
	return orderFeaturesOf(ix, func(i int) EntryFeatures { return all[i] }, perm, repeats, q)
}

// orderStored is orderFeatures on the compact store of the features.
func orderStored(ix *loader.Index, s *featureStore, perm []int, repeats []int32, q *loader.QuarantineWriter) (Features, error) {
	return orderFeaturesOf(ix, func(i int) EntryFeatures { return s.at(ix, i) }, perm, repeats, q)
}

// orderFeaturesOf orders the features at(i) of ix.Entry(i) as perm.
func orderFeaturesOf(ix *loader.Index, at func(i int) EntryFeatures, perm []int, repeats []int32, q *loader.QuarantineWriter) (Features, error) {
	if repeats != nil || len(perm) != ix.Len() {
		return orderDraws(ix, at, perm, repeats, q)
	}
	if ix.Len() > math.MaxInt32 {
		return Features{}, fmt.Errorf("pipeline: index of %d entries: more than %d", ix.Len(), math.MaxInt32)
	}
	n := 0
	for i := range ix.Len() {
		if at(i).Reject == nil {
			n++
		}
	}
	f := Features{Order: make([]int32, 0, n), Items: make([]balancer.Item, 0, n),
		Sizes: make([]image.Point, 0, n), formats: newFormatColumn(n), view: ix.View()}
	for _, i := range perm {
		id, ef := ix.ID(i), at(i)
		if ef.Reject != nil {
			q.Write(*ef.Reject)
			continue
		}
		if ef.Item.ID != id {
			return Features{}, fmt.Errorf("pipeline: features of %q for entry %q", ef.Item.ID, id)
		}
		f.Order = append(f.Order, int32(i))
		f.Items = append(f.Items, ef.Item)
		f.Sizes = append(f.Sizes, ef.Size)
		f.formats.append(ef.Format)
	}
	f.formats.done()
	return f, q.Err()
}
