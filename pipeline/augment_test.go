package pipeline

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/proto"
)

func TestAugmentRand(t *testing.T) {
	draws := func(seed uint64, epoch int, id string) [4]uint64 {
		r := AugmentRand(seed, epoch, id)
		return [4]uint64{r.Uint64(), r.Uint64(), r.Uint64(), r.Uint64()}
	}
	base := draws(7, 3, "sample-1")
	if again := draws(7, 3, "sample-1"); again != base {
		t.Fatalf("same (seed, epoch, id): %v then %v", base, again)
	}
	for _, tc := range []struct {
		name  string
		seed  uint64
		epoch int
		id    string
	}{
		{"epoch", 7, 4, "sample-1"},
		{"id", 7, 3, "sample-2"},
		{"seed", 8, 3, "sample-1"},
	} {
		if got := draws(tc.seed, tc.epoch, tc.id); got == base {
			t.Errorf("another %s gives the same draws %v", tc.name, got)
		}
	}
	// The recipe docs/augment.md gives for Python: NewEpochRand(seed ^ fnv1a64(id), epoch).
	if got, want := AugmentRand(5, 2, "a").Uint64(), uint64(0x4f51742502ed9562); got != want {
		t.Errorf("AugmentRand(5, 2, \"a\") first draw %#x, want %#x (the documented recipe)", got, want)
	}
}

// augmentConfig is the test corpus under dynamic resolution with a random
// resized crop and a flip.
func augmentConfig(input string) Config {
	cfg := testConfig(input)
	cfg.Image.Policy = imgproc.PolicyDynamic
	cfg.Image.MinPixels, cfg.Image.MaxPixels = 16*16, 256*256
	cfg.Image.DType = imgproc.DTypeUint8
	cfg.Image.Augment = imgproc.Augment{RRC: true, Scale: imgproc.DefaultScale, Ratio: imgproc.DefaultRatio, FlipP: 0.5, Seed: 9}
	return cfg
}

// Under dynamic resolution the planner prices each sample's crop of the
// epoch (computed from the header size alone), two epochs see different
// crops, and the rows the preprocessing builds have exactly the priced
// image tokens and the crop's shape.
func TestAugmentPlannerPricesTheCrop(t *testing.T) {
	ctx := context.Background()
	cfg := augmentConfig(corpus(t, 80, "jsonl"))
	d, err := OpenDataset(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	plain := cfg
	plain.Image.Augment = imgproc.Augment{}
	pd, err := OpenDataset(ctx, plain, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	tokens := map[int]map[string]int{}
	for _, epoch := range []int{0, 1} {
		pc := cfg.Plan
		pc.Epoch = epoch
		p, err := d.Epoch(ctx, pc, nil)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := pd.Epoch(ctx, pc, nil)
		if err != nil {
			t.Fatal(err)
		}
		tokens[epoch] = map[string]int{}
		changed := 0
		f := &p.Features
		for i, it := range f.Items {
			sz := f.Sizes[i]
			want := cfg.Image.AugmentedTokens(sz.X, sz.Y, AugmentCrop(cfg.Image, epoch, it.ID, sz.X, sz.Y))
			if it.ImageTokens != want {
				t.Fatalf("epoch %d %s: priced %d image tokens, its crop has %d", epoch, it.ID, it.ImageTokens, want)
			}
			if ref.Features.Items[i].ID != it.ID {
				t.Fatalf("epoch %d: the augmented order differs at %d", epoch, i)
			}
			if it.ImageTokens != ref.Features.Items[i].ImageTokens {
				changed++
			}
			tokens[epoch][it.ID] = it.ImageTokens
		}
		if changed < len(f.Items)/2 {
			t.Errorf("epoch %d: only %d of %d samples priced differently from the uncropped image", epoch, changed, len(f.Items))
		}
		checkAugmentedRows(t, p, epoch)
	}
	differ := 0
	for id, n := range tokens[0] {
		if tokens[1][id] != n {
			differ++
		}
	}
	if differ < len(tokens[0])/2 {
		t.Errorf("only %d of %d samples have other image tokens in epoch 1", differ, len(tokens[0]))
	}
}

// checkAugmentedRows preprocesses the first samples of p: each row has the
// planned image tokens, the crop's output shape, and the pixels of
// ProcessSample with the sample's generator.
func checkAugmentedRows(t *testing.T, p *Prepared, epoch int) {
	t.Helper()
	pp, err := NewPreprocessor(p)
	if err != nil {
		t.Fatal(err)
	}
	img := p.Config.Image
	proc, _ := imgproc.NewProcessor(img)
	f := &p.Features
	checked := 0
	for i := 0; i < f.Len() && checked < 8; i++ {
		it, ent := f.Items[i], f.Entry(i)
		row := pp.Row(context.Background(), ent, proto.Row{ID: it.ID, ImageTokens: int32(it.ImageTokens), Weight: 1})
		if row.Weight == 0 {
			continue // a deliberately bad sample of the corpus
		}
		checked++
		sz := f.Sizes[i]
		ow, oh := img.AugmentedSize(sz.X, sz.Y, AugmentCrop(img, epoch, it.ID, sz.X, sz.Y))
		if int(row.ImageTokens) != it.ImageTokens || row.PixelShape != [3]int32{3, int32(oh), int32(ow)} {
			t.Fatalf("epoch %d %s: row has %d tokens, shape %v; planned %d tokens, crop output %dx%d",
				epoch, it.ID, row.ImageTokens, row.PixelShape, it.ImageTokens, ow, oh)
		}
		data, err := p.Index.ReadImage(ent)
		if err != nil {
			t.Fatal(err)
		}
		want, err := proc.ProcessSample(nil, data, AugmentRand(img.Augment.Seed, epoch, it.ID))
		if err != nil || !bytes.Equal(row.Pixels, want.Data) {
			t.Fatalf("epoch %d %s: row pixels differ from ProcessSample (%v)", epoch, it.ID, err)
		}
		other := pp.EpochRow(context.Background(), epoch+1, ent, proto.Row{ID: it.ID, Weight: 1})
		oc := AugmentCrop(img, epoch+1, it.ID, sz.X, sz.Y)
		if ow2, oh2 := img.AugmentedSize(sz.X, sz.Y, oc); other.PixelShape != [3]int32{3, int32(oh2), int32(ow2)} {
			t.Fatalf("EpochRow(%d) %s: shape %v, want %dx%d", epoch+1, it.ID, other.PixelShape, ow2, oh2)
		}
	}
	if checked == 0 {
		t.Fatal("no sample preprocessed")
	}
}

// A fixed policy resizes every crop to Size×Size: the plan's items are
// those of the unaugmented dataset, while the features' fingerprint (and
// so the feature cache and the shard fingerprint) records the augmentation.
func TestAugmentFixedPolicyKeepsItems(t *testing.T) {
	ctx := context.Background()
	input := corpus(t, 40, "jsonl")
	cfg := testConfig(input)
	cfg.Image.Augment = imgproc.Augment{RRC: true, Scale: imgproc.DefaultScale, Ratio: imgproc.DefaultRatio, Seed: 1}
	aug, err := Prepare(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer aug.Close()
	plain := testConfig(input)
	ref, err := Prepare(ctx, plain, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	if len(aug.Features.Items) != len(ref.Features.Items) {
		t.Fatalf("%d items, want %d", len(aug.Features.Items), len(ref.Features.Items))
	}
	for i := range aug.Features.Items {
		if aug.Features.Items[i] != ref.Features.Items[i] {
			t.Fatalf("item %d: %+v, want %+v", i, aug.Features.Items[i], ref.Features.Items[i])
		}
	}
	fa, err := Fingerprint(cfg, aug.Index)
	if err != nil {
		t.Fatal(err)
	}
	fp, _ := Fingerprint(plain, ref.Index)
	if fa == fp {
		t.Error("the fingerprint does not record the augmentation")
	}
}

// A shard set of several epochs cannot carry each epoch's crops: refused;
// one of a single epoch records its augmentation in shard.json.
func TestShardRefusesAugmentedEpochs(t *testing.T) {
	cfg := testConfig(corpus(t, 40, "jsonl"))
	cfg.Image.Augment = imgproc.Augment{FlipP: 0.5}
	o := DefaultShardOptions()
	o.Epochs = 2
	if _, _, err := runShard(t, cfg, t.TempDir(), o, 0); !errors.Is(err, ErrAugmentEpochs) {
		t.Fatalf("2 epochs under --augment: %v, want ErrAugmentEpochs", err)
	}
	o.Epochs = 1
	dir := t.TempDir()
	if _, _, err := runShard(t, cfg, dir, o, 0); err != nil {
		t.Fatalf("1 epoch under --augment: %v", err)
	}
	if m := readManifest(t, dir); m.Augment == nil || *m.Augment != cfg.Image.Augment {
		t.Errorf("shard.json augment %v, want %+v", m.Augment, cfg.Image.Augment)
	}
}
