package main

import (
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/pipeline"
)

// jobFlags binds the flags that report, shard and serve share: dataset, world layout,
// batch shape, strategy, model shape, tokenizer and image policy.
type jobFlags struct {
	cfg       pipeline.Config
	placement string
	sync      string
	strategy  string
	tail      string
	model     string
	patchSize int
	costScale string
	costModel string
	augment   string
	augSeed   string // "" : the job seed
	mixture   string
	fs        *flag.FlagSet // to tell a given --model from the default
}

func bindJobFlags(fs *flag.FlagSet) *jobFlags {
	j := &jobFlags{cfg: pipeline.DefaultConfig(), placement: "colocated", sync: "micro-batch", strategy: "mmfeed", tail: "drop", model: "tiny", fs: fs}
	c := &j.cfg
	fs.StringVar(&c.Input, "input", "", "dataset: JSONL manifest, WebDataset .tar or .tar.gz shards (file, folder, glob or data-{000..099}.tar), Parquet, or an image folder with .txt sidecars (required)")
	fs.StringVar(&j.mixture, "mixture", "", "instead of --input: a YAML file of a weighted mixture of datasets, each with its own format options, weight and cap (docs/mixtures.md); the format flags below are every source's defaults")
	fs.StringVar(&c.Loader.Root, "root", "", "folder that image paths (a manifest's, or a Parquet/Arrow image struct's path) resolve against and may not leave (default: the manifest's or data file's folder)")
	fs.BoolVar(&c.Loader.AllowAbsolute, "allow-absolute-paths", false, "accept absolute image paths in a manifest (trusted as given)")
	fs.StringVar(&c.Loader.ImageColumn, "image-field", c.Loader.ImageColumn, "manifest field of the image path, or Parquet image column (a.b: nested; Parquet image.bytes: the struct's bytes)")
	fs.StringVar(&c.Loader.TextColumn, "text-field", c.Loader.TextColumn, "manifest field or Parquet column of the caption")
	fs.StringVar(&c.Loader.IDColumn, "id-field", c.Loader.IDColumn, "manifest field or Parquet column of the sample id (optional)")
	fs.StringVar(&c.Loader.WDSImageKeys, "wds-image-keys", loader.DefaultWDSImageKeys, "WebDataset member extensions holding the image")
	fs.StringVar(&c.Loader.WDSTextKeys, "wds-text-keys", loader.DefaultWDSTextKeys, "WebDataset caption members in priority order: ext (whole member) or ext:field (JSON field, a.b nested)")
	fs.Func("keep", "source fields the batches carry as columns keep.NAME: caption, a top-level key (url), json:a.b (a path in the manifest line or the WebDataset .json), name=field renames; e.g. url,json:label,caption", func(v string) error {
		f, err := loader.ParseKeep(v)
		c.Loader.Keep = f
		return err
	})
	fs.IntVar(&c.Plan.DP, "dp", c.Plan.DP, "data-parallel ranks")
	fs.IntVar(&c.Plan.MicroBatches, "micro-batches", c.Plan.MicroBatches, "micro-batches per rank and step")
	fs.IntVar(&c.Plan.PP, "pp", 0, "the trainer's pipeline stages per dp rank (trainer --pp; 0 or 1: none): the plan levels micro-batches for the pipeline; only stage 0 of each dp rank receives data")
	fs.IntVar(&c.Plan.GlobalBatch, "global-batch", c.Plan.GlobalBatch, "samples per step, all ranks together")
	fs.IntVar(&c.Plan.GlobalTokens, "global-tokens", 0, "tokens per step instead of --global-batch: text tokens, with --pack text + image tokens")
	fs.IntVar(&c.Plan.Budget.MaxSamples, "mb-max-samples", 0, "micro-batch budget: most samples (0: none)")
	fs.IntVar(&c.Plan.Budget.MaxPaddedTokens, "mb-max-tokens", 0, "micro-batch budget: most padded text tokens, with --pack most text + image tokens (0: none)")
	fs.IntVar(&c.Plan.Budget.MaxImageTokens, "mb-max-image-tokens", 0, "micro-batch budget: most image tokens (0: none)")
	fs.BoolVar(&c.Plan.Pack, "pack", false, "the trainer packs micro-batches (concatenated captions and patches, attention within each sample) instead of padding them")
	fs.IntVar(&c.Plan.Lookahead, "lookahead", c.Plan.Lookahead, "global batches the balancer may swap samples between (1: none)")
	fs.StringVar(&j.placement, "placement", j.placement, "colocated (step cost = vision+text+fusion) or modality (max(vision, text)+fusion)")
	fs.StringVar(&j.sync, "sync", j.sync, "where the trainer's dp ranks wait for each other: micro-batch (every micro-batch, e.g. a contrastive all-gather or FSDP) or step (only the gradient all-reduce)")
	fs.StringVar(&j.strategy, "strategy", j.strategy, "mmfeed, random (DistributedSampler) or length_grouped (HF LengthGroupedSampler)")
	fs.StringVar(&j.tail, "tail", j.tail, "incomplete last global batch: drop, or pad with zero-weight samples")
	fs.StringVar(&j.model, "model", j.model, "model shape for the cost model: a preset "+fmt.Sprint(balancer.PresetNames())+" or FILE.json in the preset schema the trainer reads too")
	fs.IntVar(&j.patchSize, "patch-size", 0, "ViT patch edge in pixels, overriding the model's (14 for ViT-L/14, SigLIP /14): image tokens and dynamic-resolution multiples")
	fs.StringVar(&j.costModel, "cost-model", "", "cost model file (serve's --cost-model-out or GET /v1/cost-model): plan with what the trainer measured instead of the --model prior")
	fs.StringVar(&j.costScale, "cost-scale", "", "multiply the cost model's vision,text,fusion coefficients, e.g. 1,8,1: a deliberately wrong prior for calibration experiments")
	fs.Uint64Var(&c.Plan.Seed, "seed", 0, "shuffle seed")
	fs.IntVar(&c.Plan.Epoch, "epoch", 0, "epoch number (with the seed, selects the order)")
	fs.StringVar(&c.Tokenizer.Path, "tokenizer", "", "tokenizer.json (default: bert-base-uncased from the build)")
	fs.IntVar(&c.Tokenizer.MaxLength, "max-length", c.Tokenizer.MaxLength, "most text tokens per sample, special tokens included")
	fs.StringVar(&c.Image.Policy, "resize", c.Image.Policy, "shorter-crop, square or dynamic")
	fs.IntVar(&c.Image.Size, "image-size", c.Image.Size, "output side S for square and shorter-crop")
	fs.IntVar(&c.Image.MinPixels, "min-pixels", c.Image.MinPixels, "dynamic: fewest pixels per image")
	fs.IntVar(&c.Image.MaxPixels, "max-pixels", c.Image.MaxPixels, "dynamic: most pixels per image")
	fs.StringVar(&c.Image.DType, "dtype", c.Image.DType, "pixel dtype on the wire: float16, float32, bfloat16 or uint8 (exact), or the lossy opt-in jpeg (resized baseline JPEG, decoded on the trainer's device) or jpeg-source (an acceptable source JPEG's own bytes, resized on the trainer; others as jpeg)")
	fs.StringVar(&c.Image.Norm, "norm", c.Image.Norm, "normalization preset: imagenet or clip")
	fs.StringVar(&c.Image.Decode, "decode", c.Image.Decode, "image decoding: exact (full size, bit-identical to Pillow/torchvision), fast (JPEG DCT-domain downscaling, Pillow's draft()) or reduce (fast at n/8 scales plus a box reduction before the resize, for --dtype jpeg; see docs/imgproc.md for their PSNR)")
	fs.IntVar(&c.Image.MaxImagePixels, "max-image-pixels", c.Image.MaxImagePixels, "decompression-bomb limit, pixels")
	fs.IntVar(&c.Workers, "workers", 0, "preprocessing goroutines (0: all cores)")
	fs.StringVar(&j.augment, "augment", "", "seeded augmentation, per sample from (--augment-seed, epoch, id): rrc (random resized crop, rrc:scale=0.08-1:ratio=0.75-1.3333333333333333) and/or hflip (hflip:p=0.5), comma-separated; see docs/augment.md")
	fs.StringVar(&j.augSeed, "augment-seed", "", "seed of --augment (default: --seed)")
	return j
}

// config resolves the string flags into the pipeline Config.
func (j *jobFlags) config() (pipeline.Config, error) {
	c := j.cfg
	var err error
	if c.Plan.Placement, err = balancer.ParsePlacement(j.placement); err != nil {
		return c, err
	}
	if c.Plan.PP == 1 {
		c.Plan.PP = 0 // one stage is no pipeline: the same plan (and plan hash) as without --pp
	}
	if c.Plan.Sync, err = balancer.ParseSync(j.sync); err != nil {
		return c, err
	}
	if c.Plan.Strategy, err = balancer.ParseStrategy(j.strategy); err != nil {
		return c, err
	}
	if c.Plan.Tail, err = balancer.ParseTail(j.tail); err != nil {
		return c, err
	}
	shape, err := balancer.Preset(j.model)
	if err != nil {
		return c, err
	}
	if j.fs != nil && set(j.fs, "model") { // the model the batches are for: check its vocabulary
		c.ModelVocab, c.ModelName = shape.Vocab, j.model
	}
	if j.patchSize != 0 {
		if shape.PatchSize = j.patchSize; j.patchSize < 0 {
			return c, fmt.Errorf("--patch-size %d: want > 0", j.patchSize)
		}
	}
	if c.Plan.Model, err = balancer.NewCostModel(shape); err != nil {
		return c, err
	}
	if j.costModel != "" {
		if c.Plan.Model, err = pipeline.LoadCostModel(j.costModel); err != nil {
			return c, fmt.Errorf("--cost-model: %w", err)
		}
	}
	if j.costScale != "" {
		if c.Plan.Model, err = scaleModel(c.Plan.Model, j.costScale); err != nil {
			return c, fmt.Errorf("--cost-scale: %w", err)
		}
	}
	if c.Plan.GlobalTokens > 0 {
		c.Plan.GlobalBatch = 0
	}
	if c.Plan.Pack { // --mb-max-tokens bounds a packed micro-batch's text + image tokens
		c.Plan.Budget.MaxTokens, c.Plan.Budget.MaxPaddedTokens = c.Plan.Budget.MaxPaddedTokens, 0
	}
	c.Image.PatchSize = shape.PatchSize // image tokens counted in the model's patches
	if c.Image.Augment, err = j.augmentation(c.Plan.Seed); err != nil {
		return c, err
	}
	switch {
	case c.Input != "" && j.mixture != "":
		return c, fmt.Errorf("--input and --mixture are exclusive: give one")
	case j.mixture != "":
		if c.Mixture, err = loadMixture(j.mixture); err != nil {
			return c, fmt.Errorf("--mixture: %w", err)
		}
		return c, c.Validate()
	case c.Input == "":
		return c, fmt.Errorf("--input (or --mixture) is required")
	}
	// A file:// URL is the local path it names, for every command (serve and
	// report took it for a path and failed on "stat file:///…").
	if rest, ok := strings.CutPrefix(c.Input, "file://"); ok {
		c.Input = rest
	}
	return c, c.Validate()
}

// augmentation resolves --augment and --augment-seed (default: seed).
func (j *jobFlags) augmentation(seed uint64) (imgproc.Augment, error) {
	a, err := imgproc.ParseAugment(j.augment)
	if err != nil {
		return a, fmt.Errorf("--augment: %w", err)
	}
	if j.augSeed != "" {
		if seed, err = strconv.ParseUint(j.augSeed, 10, 64); err != nil {
			return a, fmt.Errorf("--augment-seed %q: want an unsigned integer", j.augSeed)
		}
	}
	if a.Enabled() {
		a.Seed = seed
	}
	return a, nil
}

// loadMixture reads a mixture file; its sources' local paths become
// absolute (the workers of serve and shard --nats open them as the planner
// names them); a URL path (file://, s3://, gs://, az://, http(s)://) stays
// as given and is opened as --input's is.
func loadMixture(path string) (*loader.Mixture, error) {
	m, err := loader.LoadMixture(path)
	if err != nil {
		return nil, err
	}
	for i := range m.Sources {
		s := &m.Sources[i]
		if pipeline.IsURL(s.Path) {
			continue
		}
		if s.Path, err = filepath.Abs(s.Path); err == nil && s.Root != "" {
			s.Root, err = filepath.Abs(s.Root)
		}
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}

// scaleModel multiplies each component's coefficients by the factors "vision,text,fusion".
func scaleModel(m balancer.CostModel, spec string) (balancer.CostModel, error) {
	parts := strings.Split(spec, ",")
	if len(parts) != len(m.Coef) {
		return m, fmt.Errorf("want %d factors (vision,text,fusion), got %q", len(m.Coef), spec)
	}
	for c, p := range parts {
		f, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || !(f > 0) || math.IsInf(f, 0) {
			return m, fmt.Errorf("factor %q is not a positive number", p)
		}
		m.Coef[c] = m.Coef[c].Scale(f)
	}
	return m, nil
}
