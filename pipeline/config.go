package pipeline

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/tokenize"
)

// Config is everything a job needs to go from a dataset path to a plan.
type Config struct {
	// Input is the dataset: a JSONL manifest, WebDataset shards, Parquet, or an image folder.
	Input string
	// InputCache is the folder an input URL that is not streamed is staged in
	// (see OpenInput; one folder per URL below it). "": DefaultInputCache().
	InputCache string
	// Mixture, instead of Input, is a weighted mixture of datasets
	// (docs/mixtures.md; loader.LoadMixture reads one from YAML).
	Mixture *loader.Mixture
	// Loader configures the source (limits, Parquet columns). OnReject is set by OpenDataset.
	Loader loader.Options
	// Tokenizer selects the tokenizer.json and max length.
	Tokenizer tokenize.Config
	// ModelVocab, when > 0, is the vocabulary of the model the batches are
	// for (the --model preset given on the command line, named ModelName): a
	// tokenizer with more ids is refused when the dataset opens, not at the
	// trainer's first step. 0: no check.
	ModelVocab int    `json:",omitempty"`
	ModelName  string `json:",omitempty"`
	// Image is the resize policy, normalization and output dtype.
	Image imgproc.Config
	// Plan is the balancer configuration (dp, micro-batches, global batch, strategy, ...).
	// Plan.Seed and Plan.Epoch also select the epoch's shuffle.
	Plan balancer.Config
	// Workers is the number of feature and preprocessing goroutines. 0: all cores.
	Workers int
	// Progress, when not nil, is called as the dataset extracts features, with the
	// entries done and their total (from several goroutines; at most every 64
	// entries and at the end).
	Progress func(done, total int)
	// Features, when not nil, computes the features of the index's entries
	// instead of the feature pass on Workers goroutines (a planner's feature
	// items, a cache); Dataset.Epoch orders them for the epoch and
	// quarantines the rejects.
	Features FeatureFunc
	// FeatureCache, when not nil, keeps the features of the whole index under
	// the dataset's Fingerprint: a Dataset's first Epoch reads them from it,
	// or computes them (Features, or the feature pass) and stores them there.
	FeatureCache FeatureCache
	// MaxPixelsInFlight bounds the pixels (width × height from the image
	// headers) the preprocessing workers decode at once, so decode memory is
	// bounded per process, not only per image: many workers meeting many
	// large images wait instead of each allocating a full-size buffer. An
	// image larger than the bound decodes alone. 0: 2 × Image.MaxImagePixels.
	MaxPixelsInFlight int64
}

// DefaultConfig: bert-base-uncased at 128 tokens, shorter-crop 224 float16, the tiny
// model's cost, dp 8, global batch 128.
func DefaultConfig() Config {
	return Config{
		Loader:    loader.DefaultOptions(),
		Tokenizer: tokenize.DefaultConfig(),
		Image:     imgproc.DefaultConfig(),
		Plan:      balancer.DefaultConfig(),
	}
}

// Validate checks every part.
func (c Config) Validate() error {
	switch {
	case c.Input == "" && c.Mixture == nil:
		return errors.New("pipeline: no input")
	case c.Input != "" && c.Mixture != nil:
		return errors.New("pipeline: both an input and a mixture: give one")
	case c.Mixture != nil:
		if err := c.Mixture.Validate(); err != nil {
			return err
		}
	}
	if c.Workers < 0 {
		return fmt.Errorf("pipeline: workers %d < 0", c.Workers)
	}
	if c.MaxPixelsInFlight < 0 {
		return fmt.Errorf("pipeline: max pixels in flight %d < 0", c.MaxPixelsInFlight)
	}
	return errors.Join(c.Loader.Validate(), c.Tokenizer.Validate(), c.Image.Validate(), c.Plan.Validate())
}

func (c Config) workers() int {
	if c.Workers > 0 {
		return c.Workers
	}
	return runtime.GOMAXPROCS(0)
}

func (c Config) pixelsInFlight() int64 {
	if c.MaxPixelsInFlight > 0 {
		return c.MaxPixelsInFlight
	}
	return 2 * int64(c.Image.MaxImagePixels)
}
