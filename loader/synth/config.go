package synth

import (
	"errors"
	"fmt"
	"runtime"
)

// ErrInvalidConfig wraps every Config validation failure.
var ErrInvalidConfig = errors.New("synth: invalid config")

// Formats and skews.
const (
	FormatJSONL = "jsonl"  // images/ + manifest.jsonl
	FormatWDS   = "wds"    // shard-NNNNNN.tar WebDataset shards
	SkewStrong  = "strong" // varied sizes, content and caption lengths
	SkewNone    = "none"   // one image size, one caption length
)

// Config says what to generate.
type Config struct {
	// Out is the output folder (created). Required.
	Out string
	// Samples is the number of samples, > 0. Default 1000.
	Samples int
	// Seed makes the corpus reproducible.
	Seed uint64
	// Format is "jsonl" (default) or "wds".
	Format string
	// ShardSize is the number of samples per .tar shard (wds). Default 1000.
	ShardSize int
	// BadFraction in [0, 0.5] is the share of deliberately bad samples.
	BadFraction float64
	// Skew is "strong" (default) or "none".
	Skew string
	// MinSide and MaxSide bound image sides in pixels (strong skew).
	// Defaults 32 and 1024.
	MinSide, MaxSide int
	// FixedSide is the square image side with Skew "none". Default 256.
	FixedSide int
	// FixedWords is the caption word count with Skew "none". Default 12.
	FixedWords int
	// OmitIDs leaves the "id" field out of manifest lines (jsonl), so the
	// loader derives ids.
	OmitIDs bool
	// Workers is the number of encoding goroutines. Default GOMAXPROCS.
	Workers int
	// Progress, when not nil, is called after each written sample with the
	// samples written and Samples, from the goroutine that calls Generate.
	Progress func(done, total int)
}

// DefaultConfig returns the defaults (Out left empty).
func DefaultConfig() Config {
	return Config{
		Samples: 1000, Format: FormatJSONL, ShardSize: 1000, Skew: SkewStrong,
		MinSide: 32, MaxSide: 1024, FixedSide: 256, FixedWords: 12,
		Workers: runtime.GOMAXPROCS(0),
	}
}

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	setInt := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setInt(&c.Samples, d.Samples)
	setInt(&c.ShardSize, d.ShardSize)
	setInt(&c.MinSide, d.MinSide)
	setInt(&c.MaxSide, d.MaxSide)
	setInt(&c.FixedSide, d.FixedSide)
	setInt(&c.FixedWords, d.FixedWords)
	setInt(&c.Workers, d.Workers)
	if c.Format == "" {
		c.Format = d.Format
	}
	if c.Skew == "" {
		c.Skew = d.Skew
	}
	return c
}

// Validate checks c after defaults are applied (Generate applies them).
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Out == "":
		return fmt.Errorf("%w: Out is empty", ErrInvalidConfig)
	case c.Samples < 0 || c.ShardSize < 0 || c.Workers < 0:
		return fmt.Errorf("%w: negative Samples, ShardSize or Workers", ErrInvalidConfig)
	case c.Format != FormatJSONL && c.Format != FormatWDS:
		return fmt.Errorf("%w: format %q (want jsonl or wds)", ErrInvalidConfig, c.Format)
	case c.Skew != SkewStrong && c.Skew != SkewNone:
		return fmt.Errorf("%w: skew %q (want strong or none)", ErrInvalidConfig, c.Skew)
	case c.BadFraction < 0 || c.BadFraction > 0.5:
		return fmt.Errorf("%w: BadFraction %g not in [0, 0.5]", ErrInvalidConfig, c.BadFraction)
	case c.MinSide < 1 || c.MaxSide < c.MinSide || c.MaxSide > 8192:
		return fmt.Errorf("%w: sides [%d, %d] (want 1 <= min <= max <= 8192)", ErrInvalidConfig, c.MinSide, c.MaxSide)
	case c.FixedSide < 1 || c.FixedSide > 8192 || c.FixedWords < 1:
		return fmt.Errorf("%w: FixedSide %d or FixedWords %d", ErrInvalidConfig, c.FixedSide, c.FixedWords)
	}
	return nil
}
