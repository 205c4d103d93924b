package synth

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sync/errgroup"
)

// Kinds of injected bad samples.
const (
	BadCorrupt      = "corrupt"       // image bytes truncated and scrambled: passes the loader, fails decoding
	BadZeroByte     = "zero_byte"     // empty image file/member: loader "empty_image"
	BadMissingFile  = "missing_file"  // image absent: loader "missing_image"
	BadEmptyCaption = "empty_caption" // caption of spaces: loader "empty_caption"
	BadWrongExt     = "wrong_ext"     // PNG bytes named .jpg or JPEG named .png: passes the loader, decoders must sniff
)

var badKinds = []string{BadCorrupt, BadZeroByte, BadMissingFile, BadEmptyCaption, BadWrongExt}

// Bad is one injected bad sample.
type Bad struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`
}

// LoaderReason returns the loader reject reason this bad sample produces,
// or "" when the loader lets it through (it fails later, at decoding, or
// never for wrong_ext with a sniffing decoder).
func (b Bad) LoaderReason() string {
	switch b.Kind {
	case BadZeroByte:
		return "empty_image"
	case BadMissingFile:
		return "missing_image"
	case BadEmptyCaption:
		return "empty_caption"
	}
	return ""
}

// Summary describes what Generate wrote.
type Summary struct {
	Format    string         `json:"format"`
	Samples   int            `json:"samples"`
	Path      string         `json:"path"` // what to pass to loader.Open: the manifest or the shard folder
	Files     int            `json:"files"`
	Bytes     int64          `json:"bytes"` // image bytes written
	JPEG      int            `json:"jpeg"`
	PNG       int            `json:"png"`
	Words     int64          `json:"words"` // caption words in total
	MaxWords  int            `json:"max_words"`
	MaxPixels int            `json:"max_pixels"`
	Bad       []Bad          `json:"bad"`
	BadByKind map[string]int `json:"bad_by_kind"`
}

// item is one generated sample, ready to write.
type item struct {
	id      string
	text    string
	img     []byte
	ext     string
	bad     string
	words   int
	pixels  int
	asJSON  bool // wds: caption in a .json member
	pngData bool
}

// Generate writes the corpus described by cfg and returns its summary.
func Generate(ctx context.Context, cfg Config) (Summary, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return Summary{}, err
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return Summary{}, fmt.Errorf("synth: %w", err)
	}
	var w writer
	var err error
	if cfg.Format == FormatWDS {
		w = newTarWriter(cfg)
	} else {
		w, err = newJSONLWriter(cfg)
		if err != nil {
			return Summary{}, err
		}
	}
	sum := Summary{Format: cfg.Format, Samples: cfg.Samples, BadByKind: map[string]int{}}
	done := 0
	err = generate(ctx, cfg, func(it *item) error {
		sum.add(it)
		if err := w.write(it); err != nil {
			return err
		}
		if done++; cfg.Progress != nil {
			cfg.Progress(done, cfg.Samples)
		}
		return nil
	})
	files, path, cerr := w.close()
	if err == nil {
		err = cerr
	}
	sum.Files, sum.Path = files, path
	return sum, err
}

func (s *Summary) add(it *item) {
	s.Words += int64(it.words)
	s.MaxWords = max(s.MaxWords, it.words)
	s.MaxPixels = max(s.MaxPixels, it.pixels)
	if it.bad != BadMissingFile {
		s.Bytes += int64(len(it.img))
		if it.pngData {
			s.PNG++
		} else {
			s.JPEG++
		}
	}
	if it.bad != "" {
		s.Bad = append(s.Bad, Bad{ID: it.id, Kind: it.bad})
		s.BadByKind[it.bad]++
	}
}

// generate renders samples in parallel batches and hands them to emit in
// index order.
func generate(ctx context.Context, cfg Config, emit func(*item) error) error {
	const batch = 64
	items := make([]*item, batch)
	for start := 0; start < cfg.Samples; start += batch {
		n := min(batch, cfg.Samples-start)
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(cfg.Workers)
		for k := range n {
			g.Go(func() error {
				if err := gctx.Err(); err != nil {
					return err
				}
				it, err := makeItem(cfg, start+k)
				items[k] = it
				return err
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		for _, it := range items[:n] {
			if err := emit(it); err != nil {
				return err
			}
		}
	}
	return nil
}

// makeItem generates sample i; it depends only on (cfg, i).
func makeItem(cfg Config, i int) (*item, error) {
	r := newRng(cfg.Seed, i)
	it := &item{id: fmt.Sprintf("%08d", i)}
	if cfg.BadFraction > 0 && r.float() < cfg.BadFraction {
		it.bad = badKinds[r.intn(len(badKinds))]
	}
	spec := pickImage(r, cfg)
	it.pixels = spec.w * spec.h
	img, ext, err := render(r, spec)
	if err != nil {
		return nil, err
	}
	it.img, it.ext, it.pngData = img, ext, ext == "png"
	it.words = captionWords(r, cfg)
	it.text = caption(r, cfg, it.words)
	it.asJSON = cfg.Skew == SkewStrong && r.float() < 0.1
	injectBad(r, it)
	return it, nil
}

// injectBad spoils the item according to its bad kind.
func injectBad(r *rng, it *item) {
	switch it.bad {
	case BadCorrupt:
		cut := len(it.img) / 3
		it.img = it.img[:max(1, cut)]
		for k := 0; k < len(it.img); k += 7 {
			it.img[k] ^= byte(r.u64())
		}
	case BadZeroByte:
		it.img = []byte{}
	case BadEmptyCaption:
		it.text, it.words = "   ", 0
	case BadWrongExt:
		if it.ext == "png" {
			it.ext = "jpg"
		} else {
			it.ext = "png"
		}
	}
}

// writer stores items in one output format.
type writer interface {
	write(*item) error
	// close finishes the output and returns the number of files written
	// and the path to open with the loader.
	close() (int, string, error)
}

func (it *item) fileName() string { return it.id + "." + it.ext }
