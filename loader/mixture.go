package loader

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"regexp"
	"strings"

	"gopkg.in/yaml.v2"
)

// ErrInvalidMixture: a mixture definition is malformed (bad YAML, an unknown
// key, a bad weight, cap or name, no sources).
var ErrInvalidMixture = errors.New("loader: invalid mixture")

// Limits of a mixture definition (docs/mixtures.md).
const (
	// MaxMixtureBytes bounds a mixture file.
	MaxMixtureBytes = 1 << 20
	// MaxMixtureSources bounds the sources of a mixture.
	MaxMixtureSources = 1024
	// MaxMixtureDraws bounds the draws of a mixture epoch (the epoch's
	// features are indexed by int32).
	MaxMixtureDraws = 1 << 30
)

// Mixture is a weighted mixture of datasets: one job input whose epoch is a
// fixed number of draws from its sources (MixtureOrder, docs/mixtures.md).
// It is what a mixture YAML file holds:
//
//	draws: 100000          # optional: draws per epoch (default: the heaviest source once through)
//	sources:
//	  - name: web          # optional: [A-Za-z0-9_.-]{1,64}, unique; default the path's base name
//	    path: web/shard-{000..009}.tar
//	    weight: 6
//	    cap: 50000         # optional: most draws per epoch from this source
//	    wds_text_keys: json:caption
//	  - name: coco
//	    path: coco/manifest.jsonl
//	    weight: 3
//	    root: coco/images
//
// Relative paths (path, root) are relative to the mixture file's folder.
type Mixture struct {
	// Draws is the number of draws of an epoch before caps; 0: the draws
	// that take the heaviest-weighted source once through.
	Draws int `yaml:"draws" json:"draws,omitempty"`
	// Sources in order; the order is part of the definition.
	Sources []MixtureSource `yaml:"sources" json:"sources"`
}

// MixtureSource is one dataset of a mixture, with its own format options.
// Empty options take the job's (Options); limits (MaxImageBytes, ...) are
// the job's for every source.
type MixtureSource struct {
	Name   string  `yaml:"name" json:"name"`
	Path   string  `yaml:"path" json:"path"`
	Weight float64 `yaml:"weight" json:"weight"`
	// Cap is the most draws of this source in an epoch; 0: no cap.
	Cap           int    `yaml:"cap" json:"cap,omitempty"`
	Format        string `yaml:"format" json:"format,omitempty"`
	Root          string `yaml:"root" json:"root,omitempty"`
	AllowAbsolute bool   `yaml:"allow_absolute_paths" json:"allow_absolute_paths,omitempty"`
	ImageField    string `yaml:"image_field" json:"image_field,omitempty"`
	TextField     string `yaml:"text_field" json:"text_field,omitempty"`
	IDField       string `yaml:"id_field" json:"id_field,omitempty"`
	WDSImageKeys  string `yaml:"wds_image_keys" json:"wds_image_keys,omitempty"`
	WDSTextKeys   string `yaml:"wds_text_keys" json:"wds_text_keys,omitempty"`
}

var mixtureName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// LoadMixture reads and validates the mixture file at path (at most
// MaxMixtureBytes); relative source paths resolve against its folder.
func LoadMixture(path string) (*Mixture, error) {
	f, _, err := openRegular(path)
	if err != nil {
		return nil, fmt.Errorf("loader: mixture %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxMixtureBytes+1))
	if err != nil {
		return nil, fmt.Errorf("loader: mixture %s: %w", path, err)
	}
	if len(b) > MaxMixtureBytes {
		return nil, fmt.Errorf("loader: mixture %s: larger than %d bytes: %w", path, MaxMixtureBytes, ErrInvalidMixture)
	}
	m, err := ParseMixture(b, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("loader: mixture %s: %w", path, err)
	}
	return m, nil
}

// ParseMixture parses a mixture definition in YAML (JSON is YAML too).
// Unknown keys, duplicate keys and a second document are errors; relative
// paths are joined to dir (unless dir is ""). The result is validated.
func ParseMixture(b []byte, dir string) (m *Mixture, err error) {
	defer func() { // the YAML library must not take the service down on hostile input
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("%w: yaml: %v", ErrInvalidMixture, r)
		}
	}()
	if len(b) > MaxMixtureBytes {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrInvalidMixture, MaxMixtureBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.SetStrict(true)
	var mx Mixture
	switch err := dec.Decode(&mx); {
	case errors.Is(err, io.EOF): // an empty file: no sources
	case err != nil:
		return nil, fmt.Errorf("%w: %v", ErrInvalidMixture, err)
	default:
		var extra any
		if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: more than one YAML document", ErrInvalidMixture)
		}
	}
	for i := range mx.Sources {
		s := &mx.Sources[i]
		if s.Name == "" && s.Path != "" {
			s.Name = defaultSourceName(s.Path)
		}
		if dir != "" {
			s.Path = joinRel(dir, s.Path)
			s.Root = joinRel(dir, s.Root)
		}
	}
	if err := mx.Validate(); err != nil {
		return nil, err
	}
	return &mx, nil
}

// defaultSourceName is the path's base name up to its first dot, with other
// characters than [A-Za-z0-9_.-] replaced by "_".
func defaultSourceName(p string) string {
	base := filepath.Base(p)
	if i := bytes.IndexByte([]byte(base), '.'); i > 0 {
		base = base[:i]
	}
	out := []byte(base)
	for i, c := range out {
		if !mixtureName.MatchString(string(c)) {
			out[i] = '_'
		}
	}
	if len(out) > 64 {
		out = out[:64]
	}
	return string(out)
}

func joinRel(dir, p string) string {
	if p == "" || filepath.IsAbs(p) || strings.Contains(p, "://") { // a URL stays as given
		return p
	}
	return filepath.Join(dir, p)
}

// Validate reports why m cannot be used, wrapping ErrInvalidMixture.
func (m *Mixture) Validate() error {
	if m == nil || len(m.Sources) == 0 {
		return fmt.Errorf("%w: no sources", ErrInvalidMixture)
	}
	if len(m.Sources) > MaxMixtureSources {
		return fmt.Errorf("%w: %d sources, at most %d", ErrInvalidMixture, len(m.Sources), MaxMixtureSources)
	}
	if m.Draws < 0 || m.Draws > MaxMixtureDraws {
		return fmt.Errorf("%w: draws %d outside [0, %d]", ErrInvalidMixture, m.Draws, MaxMixtureDraws)
	}
	seen := map[string]int{}
	for i, s := range m.Sources {
		where := fmt.Sprintf("source %d (%q)", i+1, s.Name)
		switch {
		case s.Path == "":
			return fmt.Errorf("%w: %s: no path", ErrInvalidMixture, where)
		case !mixtureName.MatchString(s.Name):
			return fmt.Errorf("%w: %s: name must match [A-Za-z0-9_.-]{1,64}", ErrInvalidMixture, where)
		case !(s.Weight > 0) || math.IsInf(s.Weight, 0) || s.Weight > 1e12:
			return fmt.Errorf("%w: %s: weight %v: want a number in (0, 1e12]", ErrInvalidMixture, where, s.Weight)
		case s.Cap < 0 || s.Cap > MaxMixtureDraws:
			return fmt.Errorf("%w: %s: cap %d outside [0, %d]", ErrInvalidMixture, where, s.Cap, MaxMixtureDraws)
		}
		if j, dup := seen[s.Name]; dup {
			return fmt.Errorf("%w: %s: name also used by source %d", ErrInvalidMixture, where, j+1)
		}
		seen[s.Name] = i
		if err := s.Options(DefaultOptions()).Validate(); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalidMixture, where, err)
		}
	}
	return nil
}

// Options returns the job's loader options job with the source's format
// options in place of the job's where the source sets them.
func (s MixtureSource) Options(job Options) Options {
	o := job
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&o.Format, s.Format)
	set(&o.Root, s.Root)
	set(&o.ImageColumn, s.ImageField)
	set(&o.TextColumn, s.TextField)
	set(&o.IDColumn, s.IDField)
	set(&o.WDSImageKeys, s.WDSImageKeys)
	set(&o.WDSTextKeys, s.WDSTextKeys)
	o.AllowAbsolute = o.AllowAbsolute || s.AllowAbsolute
	return o
}
