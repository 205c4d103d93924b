package pipeline

import (
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/loader"
)

// AugmentRand returns the generator of sample id's augmentation in epoch:
// loader.NewEpochRand(seed ^ fnv1a64(id), epoch), where fnv1a64 is the
// 64-bit FNV-1a hash of the id's bytes. imgproc.Augment.Sample draws from
// it, so a sample's crop and flip are a pure function of (seed, epoch, id)
// and its image's display size (docs/augment.md has the recipe in Python).
func AugmentRand(seed uint64, epoch int, id string) *loader.SplitMix64 {
	h := fnv.New64a()
	h.Write([]byte(id)) // a hash.Hash never fails to write
	return loader.NewEpochRand(seed^h.Sum64(), uint64(epoch))
}

// AugmentCrop is the augmentation of sample id in epoch for a w×h
// (display-oriented) image under img.Augment: what ProcessSample applies.
func AugmentCrop(img imgproc.Config, epoch int, id string, w, h int) imgproc.Crop {
	return img.Augment.Sample(AugmentRand(img.Augment.Seed, epoch, id), w, h)
}

// augmentFeatures reprices f's image tokens for epoch's crops under
// img.Augment: only a random resized crop under dynamic resolution changes
// them (a fixed policy resizes every crop to Size×Size), so f is left as
// it is otherwise. It needs only the sizes of the features, no pixels.
func augmentFeatures(f *Features, img imgproc.Config, epoch int) {
	if !img.Augment.RRC || img.Policy != imgproc.PolicyDynamic {
		return
	}
	for i := range f.Items {
		it := &f.Items[i]
		sz := f.Sizes[i]
		it.ImageTokens = img.AugmentedTokens(sz.X, sz.Y, AugmentCrop(img, epoch, it.ID, sz.X, sz.Y))
	}
}

// ErrAugmentEpochs: a shard set stores each sample's pixels once and its
// later epochs index them, so it cannot carry another epoch's crops. Shard
// one epoch per set (--epochs 1 --epoch E) under augmentation.
var ErrAugmentEpochs = errors.New("pipeline: augmentation needs one epoch per shard set: its data files carry one epoch's crops")

// checkAugmentEpochs refuses a shard of several epochs under augmentation.
func checkAugmentEpochs(img imgproc.Config, epochs int) error {
	if img.Augment.Enabled() && epochs > 1 {
		return fmt.Errorf("%w (have --epochs %d, --augment %s)", ErrAugmentEpochs, epochs, img.Augment)
	}
	return nil
}

// OutputSize is the tensor width and height the preprocessing produces for
// sample id (a w×h display-oriented image) in epoch under img, its random
// resized crop included: what a planner expects a worker's row to hold.
func OutputSize(img imgproc.Config, epoch int, id string, w, h int) (ow, oh int) {
	if !img.Augment.RRC {
		return img.OutputSize(w, h)
	}
	return img.AugmentedSize(w, h, AugmentCrop(img, epoch, id, w, h))
}
