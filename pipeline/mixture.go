package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"math"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
)

// Mixtures (docs/mixtures.md)
//
// With Config.Mixture set, the dataset is one combined index of the
// mixture's sources (loader.CombineIndexes: ids "<source>/<id>"), and an
// epoch's order is the mixture's draws for (seed, epoch)
// (loader.MixtureOrder): Features.Order may name an entry more than once,
// and a repetition's id, in Items and Entry, is its draw id
// (loader.DrawID: "<source>/<id>#<repeat>"). Everything downstream (plan,
// rows, acks, quarantine, rank positions) counts draws.

// mixtureSet is a mixture dataset's sources: the combined index's layout and
// each source's draws per epoch.
type mixtureSet struct {
	def    *loader.Mixture
	index  *loader.MixtureIndex
	counts []int   // draws per epoch, per source (loader.MixtureCounts)
	inputs []Input // the sources' opened URLs (OpenInput), closed by closeInputs
}

// openMixture indexes every source of cfg.Mixture with its own format
// options and combines them; onReject receives every source's rejects, ids
// prefixed with the source's name as in the combined index. A source whose
// path is a URL is opened as --input's is (openSourceInput): streamed with
// its own Remote, or staged under cfg.InputCache.
func openMixture(ctx context.Context, cfg Config, onReject func(loader.Reject)) (*mixtureSet, error) {
	m := cfg.Mixture
	set := &mixtureSet{def: m}
	parts := make([]*loader.Index, 0, len(m.Sources))
	names := make([]string, 0, len(m.Sources))
	closeAll := func() {
		for _, p := range parts {
			p.Close()
		}
		set.closeInputs()
	}
	for _, s := range m.Sources {
		opts := s.Options(cfg.Loader)
		name := s.Name
		opts.OnReject = func(r loader.Reject) {
			if r.ID != "" {
				r.ID = name + "/" + r.ID
			}
			onReject(r)
		}
		path, err := set.openSourceInput(ctx, cfg, s.Path, &opts)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("pipeline: mixture source %s: %w", name, err)
		}
		ix, err := loader.BuildIndex(ctx, path, opts)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("pipeline: mixture source %s: index %s: %w", name, s.Path, err)
		}
		parts = append(parts, ix)
		names = append(names, name)
	}
	mi, err := loader.CombineIndexes(names, parts, onReject)
	if err != nil {
		closeAll()
		return nil, err
	}
	sizes := make([]int, len(names))
	for i := range sizes {
		sizes[i] = mi.Size(i)
	}
	counts, err := loader.MixtureCounts(m, sizes)
	if err != nil {
		mi.Close()
		set.closeInputs()
		return nil, fmt.Errorf("pipeline: mixture: %w", err)
	}
	set.index, set.counts = mi, counts
	return set, nil
}

// openSourceInput returns the path the loader reads for a source's path:
// the path itself, or for a URL what OpenInput gives (the same URLs as
// Config.Input: file://, s3://, gs://, az://, http(s):// shards), its
// Remote set in opts. The opened input is closed by closeInputs.
func (s *mixtureSet) openSourceInput(ctx context.Context, cfg Config, path string, opts *loader.Options) (string, error) {
	if !IsURL(path) {
		return path, nil
	}
	base := cfg.InputCache
	if base == "" {
		base = DefaultInputCache()
	}
	in, err := OpenInput(ctx, path, InputCacheDir(base, path))
	if err != nil {
		return "", fmt.Errorf("input %s: %w", path, err)
	}
	s.inputs = append(s.inputs, in)
	opts.Remote = in.Remote
	return in.Path, nil
}

// closeInputs closes the sources' opened URLs.
func (s *mixtureSet) closeInputs() error {
	var errs []error
	for _, in := range s.inputs {
		errs = append(errs, in.Close())
	}
	s.inputs = nil
	return errors.Join(errs...)
}

// order returns the epoch's draws as entry positions of the combined index
// and their repeats (nil: none).
func (s *mixtureSet) order(seed, epoch uint64) ([]int, []int32) {
	sizes := make([]int, len(s.counts))
	for i := range sizes {
		sizes[i] = s.index.Size(i)
	}
	return s.index.Positions(loader.MixtureOrder(sizes, s.counts, seed, epoch))
}

// MixtureSource describes one source of a mixture epoch: its definition,
// its good samples and its draws per epoch.
type MixtureSource struct {
	Name    string  `json:"name"`
	Weight  float64 `json:"weight"`
	Cap     int     `json:"cap,omitempty"`
	Samples int     `json:"samples"`
	Draws   int     `json:"draws"`
}

// MixtureSources returns the mixture's sources, or nil for a plain input.
func (d *Dataset) MixtureSources() []MixtureSource {
	if d.mix == nil {
		return nil
	}
	out := make([]MixtureSource, len(d.mix.counts))
	for i, s := range d.mix.def.Sources {
		out[i] = MixtureSource{Name: s.Name, Weight: s.Weight, Cap: s.Cap, Samples: d.mix.index.Size(i), Draws: d.mix.counts[i]}
	}
	return out
}

// SourceOf returns the mixture source of f's item i (0 for a plain input).
func (p *Prepared) SourceOf(i int) int {
	if p.ds == nil || p.ds.mix == nil {
		return 0
	}
	return p.ds.mix.index.SourceOf(int(p.Features.Order[i]))
}

// inputDefinition is what names the job's input in a fingerprint: the path,
// or the mixture's definition.
func (c Config) inputDefinition() string {
	if c.Mixture == nil {
		return c.Input
	}
	b, _ := json.Marshal(c.Mixture) // plain data: cannot fail
	return "mixture:" + string(b)
}

// inputPaths lists the job's local dataset paths: Input, or each mixture
// source's that is not a URL (a URL source's content is named by its
// entries, which the fingerprint hashes, as a streamed --input's is).
func (c Config) inputPaths() []string {
	if c.Mixture == nil {
		return []string{c.Input}
	}
	out := make([]string, 0, len(c.Mixture.Sources))
	for _, s := range c.Mixture.Sources {
		if !IsURL(s.Path) {
			out = append(out, s.Path)
		}
	}
	return out
}

// InputName is how messages name the job's input: the path, or
// "mixture of N sources (a, b, ...)".
func (c Config) InputName() string {
	if c.Mixture == nil {
		return c.Input
	}
	names := ""
	for i, s := range c.Mixture.Sources {
		if i > 0 {
			names += ", "
		}
		names += s.Name
	}
	return fmt.Sprintf("mixture of %d sources (%s)", len(c.Mixture.Sources), names)
}

// orderDraws orders the features at(i) of ix.Entry(i) as the draws perm
// (entry positions, each possibly more than once) with their repeats (nil:
// none): a repetition's item and entry carry its draw id, and a rejected
// entry is quarantined once per draw, under the draw's id.
func orderDraws(ix *loader.Index, at func(i int) EntryFeatures, perm []int, repeats []int32, q *loader.QuarantineWriter) (Features, error) {
	if len(perm) > math.MaxInt32 || (repeats != nil && len(repeats) != len(perm)) {
		return Features{}, fmt.Errorf("pipeline: %d draws with %d repeats", len(perm), len(repeats))
	}
	f := Features{Order: make([]int32, 0, len(perm)), Items: make([]balancer.Item, 0, len(perm)),
		Sizes: make([]image.Point, 0, len(perm)), formats: newFormatColumn(len(perm)), view: ix.View()}
	for k, i := range perm {
		if i < 0 || i >= ix.Len() {
			return Features{}, fmt.Errorf("pipeline: draw %d of entry %d: index of %d", k, i, ix.Len())
		}
		id, ef := ix.ID(i), at(i)
		rep := int32(0)
		if repeats != nil {
			rep = repeats[k]
		}
		if ef.Reject != nil {
			r := *ef.Reject
			r.ID = loader.DrawID(r.ID, int(rep))
			q.Write(r)
			continue
		}
		if ef.Item.ID != id {
			return Features{}, fmt.Errorf("pipeline: features of %q for entry %q", ef.Item.ID, id)
		}
		if rep > 0 {
			if f.repeats == nil {
				f.repeats = make([]int32, len(f.Order), cap(f.Order))
			}
			ef.Item.ID = loader.DrawID(id, int(rep))
		}
		if f.repeats != nil {
			f.repeats = append(f.repeats, rep)
		}
		f.Order = append(f.Order, int32(i))
		f.Items = append(f.Items, ef.Item)
		f.Sizes = append(f.Sizes, ef.Size)
		f.formats.append(ef.Format)
	}
	f.formats.done()
	return f, q.Err()
}
